"""A pooling request as the engine runs it, built the same way by the HTTP API, the SDK's
gateway and folio.LLM."""

from __future__ import annotations

from typing import Any

from folio.shared.pooling.task import PoolingTask
from folio.shared.sampling_params import SamplingParams


def pooling_params(task: PoolingTask, lora: str | None = None,
                   score_ids: tuple[int, ...] = ()) -> SamplingParams:
    """One prompt-only request: computed as a prefill, its one "sample" the pooled vector
    (with score_ids: the softmax over those tokens' logits)."""
    return SamplingParams(max_tokens=1, temperature=0.0, pooling=task.pooling_type,
                          speculative=False, lora=lora, score_token_ids=score_ids)


def score_token_ids(tokenizer: Any, task: PoolingTask) -> tuple[int, int]:
    """The scorer's (against, for) tokens as ids; ValueError unless each is one token."""
    ids = []
    for token in task.score_tokens:
        encoded = tokenizer.encode(token, add_special_tokens=False)
        if len(encoded) != 1:
            raise ValueError(f"the score token {token!r} is {len(encoded)} tokens in this "
                             "tokenizer, not one (--score-tokens)")
        ids.append(encoded[0])
    return ids[0], ids[1]
