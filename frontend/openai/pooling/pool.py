"""Pooling requests through the engine: each prompt checked, submitted as a prompt-only
request (max_tokens 1, SamplingParams.pooling set), and its vector collected.

The runner is checked first: a generate engine asked to pool, or a pooling engine asked
for what its model does not do, is a 400 naming the runner (and the model's task)."""

from __future__ import annotations

import asyncio
from typing import Any

from folio.frontend.engine_api import Engine
from folio.frontend.input_processor import InputError
from folio.frontend.openai.completions import _collect, _refused, _submit
from folio.frontend.openai.errors import ApiError
from folio.shared.pooling.requests import score_token_ids
from folio.shared.pooling.task import PoolingTask
from folio.shared.pooling.rerank_prompt import rerank_prompt
from folio.shared.sampling_params import SamplingParams

WRONG_RUNNER = "wrong_runner"


def pooling_task(engine: Engine, route: str) -> PoolingTask:
    if not engine.engine_alive:   # before its engine_info the runner is not known
        raise ApiError(503, f"the engine is unavailable: {engine.dead_reason()}",
                       code="engine_unavailable")
    task = engine.pooling
    if task is None:
        raise ApiError(400, f"{route} needs the pooling runner; this server runs the generate "
                       "runner (serve an embedding or reranker model, or --runner pooling)",
                       "model", WRONG_RUNNER)
    return task


def resolve_score_ids(engine: Engine, task: PoolingTask) -> tuple[int, int]:
    """The scorer's (against, for) token ids; a 400 unless each is one token."""
    try:
        return score_token_ids(engine.tokenizer, task)
    except ValueError as error:
        raise ApiError(400, str(error), None, "invalid_value") from None


def _ids(engine: Engine, item: str | list[int], param: str, raw_text: bool) -> list[int]:
    inputs = engine.inputs
    if isinstance(item, str):
        inputs.check_text(len(item), engine.facts, param)
        if raw_text:   # a reranker's prompt carries its own special tokens
            return engine.tokenizer.encode(item, add_special_tokens=False)
        return inputs.tokenize(prompt=item, param=param)
    inputs.check_count(len(item), engine.facts, param)
    return inputs.tokenize(token_ids=item, param=param)


async def prompt_ids(engine: Engine, items: list[str | list[int]], params: SamplingParams,
                     param: str, raw_text: bool = False) -> list[list[int]]:
    """Each input tokenized (off the event loop when large) and checked against the model:
    non-empty, within max_model_len with the one position a pooled row takes, in the
    vocabulary."""
    size = sum(len(i) for i in items)

    def work() -> list[list[int]]:
        prompts = [_ids(engine, item, param, raw_text) for item in items]
        for ids in prompts:
            engine.inputs.check_prompt(ids, params, engine.facts, param, score_only=True)
        engine.inputs.check_params(params, engine.facts)
        return prompts

    try:
        return await engine.prep.run(size, work)
    except InputError as error:
        raise _refused(error) from None


async def pool(engine: Engine, prompts: list[list[int]], params: SamplingParams
               ) -> list[bytes]:
    """Submit every prompt; their vectors, in order. A failure aborts the rest."""
    job = await _submit(engine, prompts, params, None, stream=False)
    try:
        results = await _collect(job)
    except (ApiError, asyncio.CancelledError):
        job.abort()
        raise
    vectors = [r.samples[0].pooled for r in results]
    if any(v is None for v in vectors):
        job.abort()
        raise ApiError(500, "the engine ended a pooling request without its vector")
    return vectors   # type: ignore[return-value]


def rerank_prompts(pairs: list[tuple[str, str]], instruction: str | None
                   ) -> list[str]:
    return [rerank_prompt(query, document, instruction) for query, document in pairs]


def usage(prompts: list[list[int]]) -> dict[str, Any]:
    tokens = sum(map(len, prompts))
    return {"prompt_tokens": tokens, "total_tokens": tokens}
