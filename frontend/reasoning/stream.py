"""One streamed choice split into reasoning and answer deltas, counting the reasoning's
tokens as they come (frontend/reasoning/tokens.py says which count)."""

from __future__ import annotations

from folio.frontend.reasoning.parsers import Reasoning


class ReasoningStream:
    def __init__(self, reasoning: Reasoning) -> None:
        self.reader = reasoning.reader()
        self.tokens = 0

    def feed(self, text: str, token_ids: list[int]) -> tuple[str, str]:
        """(reasoning, answer) to send now."""
        before = self.reader.in_reasoning
        reasoning, answer = self.reader.feed(text)
        if before or self.reader.in_reasoning:
            self.tokens += len(token_ids)
        return reasoning, answer

    def finish(self) -> tuple[str, str]:
        return self.reader.finish()

    @property
    def reasoned(self) -> bool:
        return self.reader.reasoned
