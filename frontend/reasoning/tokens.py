"""How many of an answer's tokens are reasoning (usage's reasoning_tokens): those generated
while the reader was inside the reasoning, the one that closes it included. A stream counts
them delta by delta (ReasoningStream); a whole answer is read token by token here, through
the same incremental detokenizer, so both count alike."""

from __future__ import annotations

from typing import Any

from folio.frontend.detokenizer import IncrementalDetokenizer
from folio.frontend.reasoning.parsers import Reasoning, keeps_special_tokens


def reasoning_tokens(reasoning: Reasoning, tokenizer: Any, token_ids: list[int]) -> int:
    reader = reasoning.reader()
    detokenizer = IncrementalDetokenizer(tokenizer, not keeps_special_tokens(reasoning.parser))
    count = 0
    for token in token_ids:
        before = reader.in_reasoning
        reader.feed(detokenizer.add([token]))
        if before or reader.in_reasoning:
            count += 1
    return count
