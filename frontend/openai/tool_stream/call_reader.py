"""Tool calls read out of a JSON answer as it streams: each call object {"name": N, <args
key>: VALUE} at a known depth becomes OpenAI's `delta.tool_calls` entries: the first
carries id, type and function.name (arguments ""), later ones pieces of the arguments as
they are written. Arguments come as the non-streamed answer writes them (an object as
json.dumps writes it; a string value, which some models write, as the string itself), so
the pieces concatenate to those arguments. Arguments written before the name wait for it.
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass, field
from typing import Any

from folio.frontend.openai.tool_stream.json_events import Event, JsonWriter


@dataclass
class StreamedCall:
    index: int
    name: str | None = None
    arguments: str = ""          # sent (or, before the name, waiting)
    started: bool = False        # its first entry was sent
    has_arguments: bool = False
    name_parts: list[str] = field(default_factory=list)


class CallReader:
    """Calls are the objects opened at `depth`; `keys`: the keys that hold arguments."""

    def __init__(self, depth: int, keys: tuple[str, ...], first_index: int = 0) -> None:
        self.depth, self.keys, self.first_index = depth, keys, first_index
        self.calls: list[StreamedCall] = []
        self.call: StreamedCall | None = None   # the one being read
        self.key: str | None = None
        self.writer: JsonWriter | None = None
        self.string_arguments = False

    def read(self, events: list[Event]) -> list[dict[str, Any]]:
        entries: list[dict[str, Any]] = []
        for event in events:
            self._event(event, entries)
        return entries

    def _event(self, event: Event, entries: list[dict[str, Any]]) -> None:
        kind, depth, text = event
        if depth == self.depth and kind == "open" and text == "{":
            self.call = StreamedCall(self.first_index + len(self.calls))
            self.key = None
            return
        call = self.call
        if call is None or depth < self.depth:
            return
        if depth == self.depth:
            if kind == "key":
                self.key, self.writer = text, None
            elif kind == "close":   # the call ends
                if call.name is not None:
                    if not call.has_arguments:   # as the parsers read a call without any
                        self._piece(call, "{}", entries)
                    self.calls.append(call)
                self.call = None
            return
        if self.key == "name":
            if depth == self.depth + 1 and kind == "str_part":
                call.name_parts.append(text)
            elif depth == self.depth + 1 and kind == "str_close" and call.name is None:
                call.name = "".join(call.name_parts)
                self._start(call, entries)
        elif self.key in self.keys and not call.has_arguments or self.writer is not None \
                or self.string_arguments:
            self._argument(call, event, entries)

    def _argument(self, call: StreamedCall, event: Event, entries: list[dict[str, Any]]
                  ) -> None:
        kind, depth, text = event
        if self.writer is None and not self.string_arguments:   # the value begins
            call.has_arguments = True
            if kind == "str_open" and depth == self.depth + 1:
                self.string_arguments = True
                return
            self.writer = JsonWriter(self.depth + 1)
        if self.string_arguments:
            if kind == "str_part":
                self._piece(call, text, entries)
            else:   # str_close: the string ends
                self.string_arguments = False
                self.key = None
            return
        self._piece(call, self.writer.write(event), entries)
        if depth == self.depth + 1 and kind in ("close", "scalar", "str_close"):
            self.writer, self.key = None, None   # the value ends

    def _start(self, call: StreamedCall, entries: list[dict[str, Any]]) -> None:
        call.started = True
        entries.append({"index": call.index, "id": f"call_{uuid.uuid4().hex[:24]}",
                        "type": "function",
                        "function": {"name": call.name, "arguments": ""}})
        if call.arguments:   # written before the name
            entries.append(_piece_entry(call.index, call.arguments))

    def _piece(self, call: StreamedCall, piece: str, entries: list[dict[str, Any]]) -> None:
        if not piece:
            return
        call.arguments += piece
        if call.started:
            entries.append(_piece_entry(call.index, piece))


def _piece_entry(index: int, piece: str) -> dict[str, Any]:
    return {"index": index, "function": {"arguments": piece}}
