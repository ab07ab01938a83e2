"""One JSON value read a piece at a time, as events, and written back as the non-streamed
answer writes it (`json.dumps(json.loads(text), ensure_ascii=False)`), as far as it is read.

A tool call's arguments stream this way: each piece is final when it is sent, and the
pieces concatenate to the arguments the whole answer gives. Events carry the depth of what
they describe (the number of containers around a value; a key has its object's depth):

  ("open", d, "{" | "[")  ("close", d, "}" | "]")  ("key", d, decoded key)
  ("str_open", d, "")  ("str_part", d, decoded characters)  ("str_close", d, "")
  ("scalar", d, its text as json.dumps writes it)
"""

from __future__ import annotations

import json
import re

Event = tuple[str, int, str]
_NUMBER = re.compile(r"-?(?:0|[1-9][0-9]*)(\.[0-9]+)?([eE][+-]?[0-9]+)?")
_NUMBER_CHARS = frozenset("+-0123456789.eE")
_LITERALS = {"true": "true", "false": "false", "null": "null", "NaN": "NaN",
             "Infinity": "Infinity"}   # Python's json reads the last two as floats
_ESCAPES = {'"': '"', "\\": "\\", "/": "/", "b": "\b", "f": "\f", "n": "\n", "r": "\r",
            "t": "\t"}
_WHITESPACE = " \t\r\n"


class JsonLexer:
    """Reads one JSON value; `feed` returns the events of the characters it took. It stops
    at the end of the value (`done`; `used` counts the characters it took in all) or at
    the first character that cannot continue it (`failed`)."""

    def __init__(self) -> None:
        self.stack: list[list] = []   # per open container: [bracket, expecting]
        self.expect = "value"          # at the top: a value
        self.token: str | None = None  # "str", "key", "num", "lit" while one is open
        self.buffer = ""               # a number's or literal's characters; an escape's
        self.key = ""                  # the key being read
        self.escape = False
        self.pending_high = ""         # a \\uD800-\\uDBFF escape waiting for its pair
        self.done = self.failed = False
        self.used = 0

    # ---- public -----------------------------------------------------------------------

    def feed(self, text: str) -> list[Event]:
        events: list[Event] = []
        for char in text:
            if self.done or self.failed:
                break
            self._char(char, events)
            if self.failed:
                break
            self.used += 1
        return events

    def finish(self) -> list[Event]:
        """The text ended: a number at the top level ends with it."""
        events: list[Event] = []
        if self.token == "num" and not self.stack:
            self._end_number(events)
        return events

    # ---- the machine --------------------------------------------------------------------

    def _char(self, char: str, events: list[Event]) -> None:
        if self.token in ("str", "key"):
            self._string_char(char, events)
        elif self.token == "num":
            if char in _NUMBER_CHARS:
                self.buffer += char
                return
            self._end_number(events)
            if not self.failed:
                self._char(char, events)
        elif self.token == "lit":
            self.buffer += char
            if self.buffer in _LITERALS:
                self.token = None
                self._value_done(events, ("scalar", len(self.stack), _LITERALS[self.buffer]))
            elif not any(word.startswith(self.buffer) for word in _LITERALS):
                self.failed = True
        elif char in _WHITESPACE:
            return
        elif self.expect in ("value", "first_value"):
            self._value_start(char, events)
        elif self.expect in ("key", "first_key"):
            if char == '"':
                self.token, self.key = "key", ""
            elif char == "}" and self.expect == "first_key":
                self._close(char, events)
            else:
                self.failed = True
        elif self.expect == "colon":
            if char != ":":
                self.failed = True
            self.expect = "value"
        elif self.expect == "after":
            bracket = self.stack[-1][0] if self.stack else None
            if char == ",":
                self.expect = "key" if bracket == "{" else "value"
            elif char == {"{": "}", "[": "]"}.get(bracket):
                self._close(char, events)
            else:
                self.failed = True
        else:
            self.failed = True

    def _value_start(self, char: str, events: list[Event]) -> None:
        depth = len(self.stack)
        if char in "{[":
            events.append(("open", depth, char))
            self.stack.append([char])
            self.expect = "first_key" if char == "{" else "first_value"
        elif char == "]" and self.expect == "first_value":
            self._close(char, events)
        elif char == '"':
            self.token, self.buffer = "str", ""
            events.append(("str_open", depth, ""))
        elif char == "-" or char.isdigit():
            self.token, self.buffer = "num", char
        elif char in "tfnNI":
            self.token, self.buffer = "lit", char
        else:
            self.failed = True

    def _close(self, char: str, events: list[Event]) -> None:
        self.stack.pop()
        self._value_done(events, ("close", len(self.stack), char))

    def _value_done(self, events: list[Event], event: Event) -> None:
        events.append(event)
        if self.stack:
            self.expect = "after"
        else:
            self.done = True

    def _end_number(self, events: list[Event]) -> None:
        text, self.token = self.buffer, None
        match = _NUMBER.fullmatch(text)
        if match is None:
            self.failed = True
            return
        value = json.dumps(float(text)) if match.group(1) or match.group(2) else str(int(text))
        self._value_done(events, ("scalar", len(self.stack), value))

    def _string_char(self, char: str, events: list[Event]) -> None:
        if self.escape:
            self.buffer += char
            if self.buffer[1:2] != "u":
                decoded = _ESCAPES.get(self.buffer[1])
                if decoded is None:
                    self.failed = True
                    return
                self._decoded(decoded, events)
            elif len(self.buffer) == 6:
                try:
                    self._decoded(chr(int(self.buffer[2:], 16)), events)
                except ValueError:
                    self.failed = True
            return
        if char == "\\":
            self.escape, self.buffer = True, "\\"
            return
        if char == '"':
            self._flush_high(events)
            depth = len(self.stack)
            if self.token == "key":
                self.token = None
                events.append(("key", depth - 1, self.key))
                self.expect = "colon"
            else:
                self.token = None
                self._value_done(events, ("str_close", depth, ""))
            return
        if ord(char) < 0x20:   # json.loads refuses raw control characters
            self.failed = True
            return
        self._flush_high(events)
        self._part(char, events)

    def _decoded(self, char: str, events: list[Event]) -> None:
        """One escape read: a high surrogate waits for the low one it may pair with."""
        self.escape, self.buffer = False, ""
        if self.pending_high and 0xDC00 <= ord(char) <= 0xDFFF:
            high, self.pending_high = self.pending_high, ""
            self._part(chr(0x10000 + ((ord(high) - 0xD800) << 10) + ord(char) - 0xDC00), events)
            return
        self._flush_high(events)
        if 0xD800 <= ord(char) <= 0xDBFF:
            self.pending_high = char
        else:
            self._part(char, events)

    def _flush_high(self, events: list[Event]) -> None:
        if self.pending_high:
            high, self.pending_high = self.pending_high, ""
            self._part(high, events)

    def _part(self, chars: str, events: list[Event]) -> None:
        if self.token == "key":
            self.key += chars
        elif events and events[-1][0] == "str_part":   # one event per piece, not per char
            events[-1] = ("str_part", len(self.stack), events[-1][2] + chars)
        else:
            events.append(("str_part", len(self.stack), chars))


class JsonWriter:
    """Writes the events of one value at depth `depth` (and of what it contains) as
    json.dumps writes that value: ", " and ": " between items, strings escaped as
    ensure_ascii=False escapes them."""

    def __init__(self, depth: int) -> None:
        self.depth = depth
        self.open: list[list] = []   # per open container of the value: [bracket, items]

    def write(self, event: Event) -> str:
        kind, depth, text = event
        if kind == "key":
            out = (", " if self.open[-1][1] else "") + _quoted(text) + ": "
            self.open[-1][1] += 1
            return out
        if kind == "close":
            self.open.pop()
            return text
        if kind == "str_part":
            return _quoted(text)[1:-1]
        if kind == "str_close":
            return '"'
        out = ""   # a value begins: in an array, after a comma unless it is the first
        if depth > self.depth and self.open[-1][0] == "[":
            out = ", " if self.open[-1][1] else ""
            self.open[-1][1] += 1
        if kind == "open":
            self.open.append([text, 0])
        return out + ('"' if kind == "str_open" else text)


def _quoted(text: str) -> str:
    return json.dumps(text, ensure_ascii=False)
