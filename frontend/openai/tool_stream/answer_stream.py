"""One streamed chat choice under tool calling: content as it comes, up to where a call may
begin, and each call's arguments in pieces as they are generated (OpenAI's and vLLM's
stream shape), for every mode and parser:

  named               the answer is the arguments: streamed as written.
  required            a JSON array of {"name", "parameters"} (the grammar's): each call
                      streams as it is written.
  auto, hermes        content up to "<tool_call>" (a tail that may begin one waits); then
                      each <tool_call>{"name", "arguments"}</tool_call> streams.
  auto, llama3_json   an answer that begins with "{" (or <|python_tag|>) is calls, each
                      streamed; any other is content, streamed whole.
  auto, generic       {"tool_calls": [{"name", "arguments"}, ...]} streams its calls; a
                      {"response": ...} answer is content, sent when it is read whole.

At the end the whole answer is read as the non-streamed one is (ToolPlan.read), and what
the stream has not sent yet goes out: the rest of an argument, a call not yet seen. A
call streamed and then not in that reading (cut short by max_tokens, or a hermes block
that turned out malformed) cannot be taken back; it stays as sent.
"""

from __future__ import annotations

from typing import Any

from folio.frontend.openai.tool_calls import ToolPlan, openai_calls
from folio.frontend.openai.tool_parsers import (HERMES_END, HERMES_START, PYTHON_TAG,
                                                stream_holdback)
from folio.frontend.openai.tool_stream.call_reader import CallReader
from folio.frontend.openai.tool_stream.json_events import JsonLexer

Entries = list[dict[str, Any]]
_BETWEEN_LLAMA3_CALLS = " \t\r\n;"


class ToolStream:
    def __init__(self, tools: ToolPlan) -> None:
        self.tools, self.text, self.sent = tools, "", 0   # sent: content characters
        self.named_id: str | None = None
        self.reader: CallReader | None = None
        self.lexer: JsonLexer | None = None
        self.read_to = 0          # the answer's characters the call readers have taken
        self.broken = False       # not the format: calls wait for the end
        self.content_mode = False  # llama3_json: an answer in words
        self.seeking: str | None = HERMES_START   # hermes: the tag looked for next
        if tools.mode == "required":
            self.reader, self.lexer = CallReader(1, ("parameters",)), JsonLexer()
        elif tools.mode == "auto" and tools.generic:
            self.reader, self.lexer = CallReader(2, ("arguments",)), JsonLexer()
        elif tools.mode == "auto":
            keys = ("arguments", "parameters") if tools.parser == "hermes" else \
                ("parameters", "arguments")
            self.reader = CallReader(0, keys)

    def feed(self, text: str) -> tuple[str, Entries]:
        """(content to send now, tool_calls delta entries to send now)."""
        self.text += text
        if self.tools.mode == "named":
            return "", self._named(text)
        if self.tools.mode == "auto" and not self.tools.generic:
            return self._auto()
        if self.tools.mode in ("required", "auto"):
            return "", self._lex()
        return "", []

    def finish(self) -> tuple[str, Entries, bool]:
        """(content not yet sent, tool_calls entries not yet sent, whether it called)."""
        if self.tools.mode == "named":
            return "", self._named("") if self.named_id is None else [], True
        content, calls = self.tools.read(self.text)
        streamed = self.reader.calls if self.reader is not None else []
        if self.reader is not None and self.reader.call is not None \
                and self.reader.call.started:   # cut short while being written
            streamed = [*streamed, self.reader.call]
        entries: Entries = []
        for i, (name, arguments) in enumerate(calls):
            if i >= len(streamed):
                entries.append({"index": i, **openai_calls([(name, arguments)])[0]})
                continue
            sent = streamed[i]
            if sent.name == name and arguments.startswith(sent.arguments) \
                    and arguments != sent.arguments:
                entries.append({"index": i, "function": {
                    "arguments": arguments[len(sent.arguments):]}})
        called = bool(calls) or any(call.started for call in streamed)
        if self.tools.buffers:
            return ("" if called else content or ""), entries, called
        if not called:
            return self.text[self.sent:], entries, False
        end = max(self.sent, stream_holdback(self.tools.parser, self.text))
        return self.text[self.sent:end], entries, True

    # ---- the modes ----------------------------------------------------------------------

    def _named(self, text: str) -> Entries:
        """The answer is the arguments: the first entry names the call, the text follows."""
        entries: Entries = []
        if self.named_id is None:
            call = openai_calls([(self.tools.named, "")])[0]
            self.named_id = call["id"]
            entries.append({"index": 0, **call})
        if text:
            entries.append({"index": 0, "function": {"arguments": text}})
        return entries

    def _lex(self) -> Entries:
        """The whole answer is one JSON value (required, generic auto)."""
        if self.lexer.failed or self.lexer.done:
            return []
        events = self.lexer.feed(self.text[self.read_to:])
        self.read_to = len(self.text)
        return self.reader.read(events)

    def _auto(self) -> tuple[str, Entries]:
        """hermes / llama3_json: content, then calls."""
        end = max(self.sent, stream_holdback(self.tools.parser, self.text))
        content, self.sent = self.text[self.sent:end], end
        if self.broken or self.content_mode:
            return content, []
        if self.tools.parser == "hermes":
            return content, self._hermes_calls()
        return content, self._llama3_calls()

    def _hermes_calls(self) -> Entries:
        entries: Entries = []
        while not self.broken and self._more_calls():
            if self.seeking is not None:   # a tag: after a call its end, then the next start
                found = self.text.find(self.seeking, self.read_to)
                if found < 0:   # look again only where a tag cut by this piece may begin
                    self.read_to = max(self.read_to, len(self.text) - len(self.seeking) + 1)
                    return entries
                self.read_to = found + len(self.seeking)
                if self.seeking == HERMES_END:
                    self.seeking = HERMES_START
                    continue
                self.seeking, self.lexer = None, JsonLexer()
            entries += self._call_object()
            if self.lexer is not None:
                return entries   # the call goes on in the next piece
            self.seeking = HERMES_END
        return entries

    def _llama3_calls(self) -> Entries:
        if self.read_to == 0:
            body = self.text.lstrip()
            if not body or PYTHON_TAG.startswith(body[:len(PYTHON_TAG)]) \
                    and len(body) < len(PYTHON_TAG):
                return []   # too little to tell yet
            skip = len(self.text) - len(body)
            if body.startswith(PYTHON_TAG):
                skip += len(PYTHON_TAG)
            elif not body.startswith("{"):
                self.content_mode = True
                return []
            self.read_to = skip
        entries: Entries = []
        while not self.broken and self._more_calls():
            if self.lexer is None:
                while self.read_to < len(self.text) and \
                        self.text[self.read_to] in _BETWEEN_LLAMA3_CALLS:
                    self.read_to += 1
                if self.read_to == len(self.text):
                    return entries
                self.lexer = JsonLexer()
            entries += self._call_object()
            if self.lexer is not None:
                return entries
        return entries

    def _call_object(self) -> Entries:
        """Feed the call object being read; the lexer is dropped once it ends."""
        before = self.lexer.used
        events = self.lexer.feed(self.text[self.read_to:])
        self.read_to += self.lexer.used - before
        entries = self.reader.read(events)
        if self.lexer.failed:
            self.broken = True
        elif self.lexer.done:
            self.lexer = None
        return entries

    def _more_calls(self) -> bool:
        return self.tools.parallel or not self.reader.calls
