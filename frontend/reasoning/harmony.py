"""gpt-oss's harmony format, streamed: the answer is a run of messages, each a header then
a body,

    <|channel|>analysis<|message|>reasoning<|end|>
    <|start|>assistant<|channel|>final<|message|>answer<|return|>

(the generation prompt ends in `<|start|>assistant`). Bodies on the `analysis` channel are
the reasoning; every other body (`final`, and `commentary` preambles) is the answer, in
order. Headers and markers are dropped. Text that does not open with a header is all
answer (a grammar-held answer, or a model that skipped the format). Harmony's markers are
special tokens: a request read by this parser keeps them in its text
(skip_special_tokens is off for it, frontend/reasoning/parsers.py).
"""

from __future__ import annotations

import re

from folio.frontend.reasoning.held import HeldText, partial_marker

MESSAGE = "<|message|>"
_ENDS = ("<|end|>", "<|return|>", "<|call|>", "<|start|>")
_CHANNEL = re.compile(r"<\|channel\|>\s*([A-Za-z_]+)")
_HEADER, _BODY = "header", "body"
REASONING_CHANNEL = "analysis"


class HarmonyReader(HeldText):
    def __init__(self) -> None:
        self.state, self.channel, self.buffer = _HEADER, "", ""
        self.answered = False   # an answer body has begun
        self.reasoned = False

    @property
    def in_reasoning(self) -> bool:
        if self.state == _BODY:
            return self.channel == REASONING_CHANNEL
        return not self.answered

    def _run(self, final: bool) -> tuple[str, str]:
        reasoning, answer = [], []
        while self.buffer:
            if self.state == _HEADER:
                if not self._header(final):
                    break
                continue
            found = [(at, marker) for marker in _ENDS
                     if (at := self.buffer.find(marker)) >= 0]
            if found:
                at, marker = min(found)
                body, self.buffer = self.buffer[:at], self.buffer[at + len(marker):]
                self.state = _HEADER
                if marker == "<|start|>":
                    self.buffer = marker + self.buffer
            else:
                held = 0 if final else partial_marker(self.buffer, _ENDS)
                body = self.buffer[:len(self.buffer) - held]
                self.buffer = self.buffer[len(body):]
            (reasoning if self.channel == REASONING_CHANNEL else answer).append(body)
            if not found:
                break
        return "".join(reasoning), "".join(answer)

    def _header(self, final: bool) -> bool:
        """Read a header once it is whole; False: wait for more text."""
        body = self.buffer.lstrip()
        if body and not body.startswith("<|") and not "<|".startswith(body):
            self._open("final")   # no header: plain text is the answer
            return True
        at = self.buffer.find(MESSAGE)
        if at < 0:
            if final:
                self.buffer = ""   # a header cut short says nothing
            return False
        channel = _CHANNEL.search(self.buffer, 0, at)
        self.buffer = self.buffer[at + len(MESSAGE):]
        self._open(channel.group(1) if channel else "final")
        return True

    def _open(self, channel: str) -> None:
        self.state, self.channel = _BODY, channel
        if channel == REASONING_CHANNEL:
            self.reasoned = True
        else:
            self.answered = True
