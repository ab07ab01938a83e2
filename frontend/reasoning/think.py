"""`<think>reasoning</think>answer`, streamed (Qwen3, DeepSeek-R1, SmolLM3 style).

The reader starts inside the reasoning when the generation prompt already opened `<think>`
(the template wrote it, so only `</think>` appears) or when the parser says the model always
reasons first (deepseek_r1, as vLLM reads it); otherwise an answer that begins with
`<think>` (after whitespace) opens it, and any other answer has no reasoning.

Whitespace around the markers is dropped (templates write `<think>\\n…\\n</think>\\n\\n`):
the reasoning is trimmed at both ends, the answer after `</think>` at its start; an answer
without reasoning is the text as written. What is held back is only what may still turn
out to be `</think>` or the whitespace before it, so a stream splits as the whole text does.
"""

from __future__ import annotations

from folio.frontend.reasoning.held import HeldText, partial_marker, trailing_space

START, END = "<think>", "</think>"
_OPENING, _REASONING, _ANSWER = "opening", "reasoning", "answer"


class ThinkReader(HeldText):
    def __init__(self, inside: bool) -> None:
        # opening: nothing decided yet (a leading <think> may come). `inside`: the prompt
        # opened it, or the parser reads every answer as reasoning first; a leading
        # <think> the model writes anyway is dropped then too.
        self.state = _OPENING
        self.inside = inside
        self.buffer = ""          # text not yet given out
        self.started = False      # the current part has given out text (its start trimmed)
        self.reasoned = inside    # this answer has a reasoning part

    @property
    def in_reasoning(self) -> bool:
        return self.state == _REASONING or (self.state == _OPENING and self.inside)

    def _run(self, final: bool) -> tuple[str, str]:
        if self.state == _OPENING:
            body = self.buffer.lstrip()
            if body.startswith(START):
                self.buffer, self.state, self.reasoned = body[len(START):], _REASONING, True
            elif not final and START.startswith(body):
                return "", ""   # whitespace or a part of <think>: wait
            elif self.inside:
                self.state = _REASONING
            else:   # no reasoning: the answer is the text as written
                self.state, self.started = _ANSWER, True
        reasoning = ""
        if self.state == _REASONING:
            found = self.buffer.find(END)
            if found < 0:
                return self._reasoning(self.buffer, final), ""
            text, rest = self.buffer[:found], self.buffer[found + len(END):]
            reasoning = self._reasoning(text, True)
            self.buffer, self.state, self.started = rest, _ANSWER, False
        return reasoning, self._answer()

    def _reasoning(self, text: str, ended: bool) -> str:
        """The reasoning sure now: its leading whitespace dropped and, until it ends, a
        trailing run of whitespace and `</think>` prefix held back (dropped at the end)."""
        if not self.started:
            text = text.lstrip()
        held = 0 if ended else partial_marker(text, (END,))
        end = trailing_space(text, len(text) - held)
        self.buffer = text[end:]
        self.started = self.started or end > 0
        return text[:end]

    def _answer(self) -> str:
        text, self.buffer = self.buffer, ""
        if not self.started:   # right after </think>: the whitespace before the answer
            text = text.lstrip()
            self.started = bool(text)
        return text
