"""folio.LLM's pooling API, vLLM-style: `LLM.embed(prompts)` and `LLM.score(text_1,
text_2)` on a pooling-runner engine (docs/serving.md, "Embeddings, rerank and score").

The same requests as the server's: prompt-only (max_tokens 1, SamplingParams.pooling),
checked by the same input processor, scored through the same reranker prompt; the vectors
come out of the same executor code (executor/pooling/)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from folio.frontend.output_loop import OutputEvents, OutputLoop
from folio.frontend.output_processor import RequestState, vllm_logprob
from folio.shared.pooling.requests import pooling_params, score_token_ids
from folio.shared.pooling.rerank_prompt import rerank_prompt
from folio.shared.pooling.task import PoolingTask
from folio.shared.pooling.vectors import embedding, score
from folio.shared.sampling_params import SamplingParams


@dataclass
class EmbeddingOutput:
    embedding: list[float]


@dataclass
class EmbeddingRequestOutput:
    request_id: str
    prompt_token_ids: list[int]
    outputs: EmbeddingOutput
    finished: bool = True


@dataclass
class ScoringOutput:
    score: float


@dataclass
class ScoringRequestOutput:
    request_id: str
    prompt_token_ids: list[int]   # the reranker's prompt (empty for an embedding model)
    outputs: ScoringOutput
    finished: bool = True


def pooling_task(llm, what: str) -> PoolingTask:
    task = llm.engine.executor.pooling_task
    if task is None:
        raise ValueError(f"{what} needs the pooling runner; this engine runs the generate "
                         "runner (an embedding or reranker model, or runner='pooling')")
    return task


def embed(llm, prompts: Sequence[str | list[int]], dimensions: int | None = None
          ) -> list[EmbeddingRequestOutput]:
    """One embedding per prompt (a string or token ids)."""
    task = pooling_task(llm, "embed")
    if task.scores:
        raise ValueError("this model is a reranker: use LLM.score")
    if dimensions is not None:
        problem = task.dimensions_problem(dimensions)
        if problem is not None:
            raise ValueError(problem)
    params = pooling_params(task)
    ids = [_prompt_ids(llm, p, params, raw=False) for p in prompts]
    vectors = _run(llm, ids, params)
    return [EmbeddingRequestOutput(request_id, prompt,
                                   EmbeddingOutput(embedding(v, task.normalize,
                                                             dimensions).tolist()))
            for (request_id, v), prompt in zip(vectors, ids)]


def score_pairs(llm, text_1: str | Sequence[str], text_2: str | Sequence[str],
                instruction: str | None = None) -> list[ScoringRequestOutput]:
    """One text_1 against each text_2, or pairs in order (as vLLM's LLM.score)."""
    task = pooling_task(llm, "score")
    firsts = [text_1] if isinstance(text_1, str) else list(text_1)
    seconds = [text_2] if isinstance(text_2, str) else list(text_2)
    if len(firsts) == 1:
        firsts = firsts * len(seconds)
    if not seconds or len(firsts) != len(seconds):
        raise ValueError(f"text_1 has {len(firsts)} texts and text_2 {len(seconds)}: give "
                         "one text_1, or as many as text_2")
    pairs = list(zip(firsts, seconds))
    if task.scores:
        params = pooling_params(task, None, score_token_ids(llm.tokenizer, task))
        ids = [_prompt_ids(llm, rerank_prompt(a, b, instruction), params, raw=True)
               for a, b in pairs]
        return [ScoringRequestOutput(request_id, prompt, ScoringOutput(score(v)))
                for (request_id, v), prompt in zip(_run(llm, ids, params), ids)]
    texts = list(dict.fromkeys(t for pair in pairs for t in pair))
    params = pooling_params(task)
    ids = [_prompt_ids(llm, t, params, raw=False) for t in texts]
    vectors = {t: embedding(v, True) for t, (_, v) in zip(texts, _run(llm, ids, params))}
    return [ScoringRequestOutput(f"score-{i}", [], ScoringOutput(
        float(np.dot(vectors[a], vectors[b])))) for i, (a, b) in enumerate(pairs)]


def _prompt_ids(llm, prompt: str | list[int], params: SamplingParams, raw: bool
                ) -> list[int]:
    inputs = llm.inputs
    if isinstance(prompt, str) and raw:
        if llm.tokenizer is None:
            raise ValueError("scoring text needs a tokenizer")
        ids = llm.tokenizer.encode(prompt, add_special_tokens=False)
    elif isinstance(prompt, str):
        ids = inputs.tokenize(prompt=prompt)
    elif isinstance(prompt, (list, tuple)) and all(
            isinstance(t, int) and not isinstance(t, bool) for t in prompt):
        ids = list(prompt)
    else:
        raise TypeError("a prompt must be a string or a list of token ids")
    inputs.check_prompt(ids, params, llm.facts, score_only=True)
    inputs.check_params(params, llm.facts)
    return ids


def _run(llm, prompts: list[list[int]], params: SamplingParams) -> list[tuple[str, bytes]]:
    """Every prompt through the engine; (request id, vector) in order."""
    engine = llm.engine
    loop: OutputLoop[None] = OutputLoop(OutputEvents(), engine.abort_request)
    states, ids = [], []
    try:
        for prompt in prompts:
            request_id = f"pool-{llm._counter}"
            llm._counter += 1
            state = RequestState(llm.tokenizer, params, prompt, vllm_logprob)
            loop.track(request_id, None, state, engine.add_request(request_id, prompt, params))
            states.append(state)
            ids.append(request_id)
        while engine.has_unfinished_requests():
            loop.feed(engine.step())
    except BaseException:
        for request_id in ids:
            engine.abort_request(request_id)
        raise
    vectors = [state.samples[0].pooled for state in states]
    failed = [s.samples[0].finish_reason for s, v in zip(states, vectors) if v is None]
    if failed:
        raise RuntimeError(f"{len(failed)} pooling request(s) ended without a vector "
                           f"({failed[0]})")
    return list(zip(ids, vectors))
