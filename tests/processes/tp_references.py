"""The greedy answers the tensor-parallel tests compare against (test_tensor_parallel.py's
PROMPTS and MAX_TOKENS): one rank through folio.LLM, and transformers. Each is computed once
per checkpoint and session: both are deterministic and the session's checkpoints never change,
so three test modules (served, offline, two hosts) need not pay for them three times."""

from __future__ import annotations

from collections.abc import Callable


class GreedyReferences:
    """Answers by (kind, checkpoint, count), made on first use."""

    def __init__(self, one_rank: Callable, transformers: Callable) -> None:
        """one_rank(model_dir) and transformers(model_dir, count): the answers to the first
        `count` prompts."""
        self._makers = {"one_rank": one_rank, "transformers": transformers}
        self._made: dict[tuple, list[list[int]]] = {}

    def _get(self, kind: str, model_dir, *args) -> list[list[int]]:
        key = (kind, str(model_dir), *args)
        if key not in self._made:
            self._made[key] = self._makers[kind](model_dir, *args)
        return self._made[key]

    def one_rank(self, model_dir) -> list[list[int]]:
        return self._get("one_rank", model_dir)

    def transformers(self, model_dir, count: int | None = None) -> list[list[int]]:
        """transformers' answers to the first `count` prompts (all: None)."""
        return self._get("transformers", model_dir, count)
