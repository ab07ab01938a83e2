"""The pooling endpoints' work and answers: OpenAI's embeddings list, Jina's/Cohere's
rerank results, vLLM's score list.

Rerank and score run on either kind of pooling model: a scorer (decoder reranker) scores
each (query, document) pair from its two token logits through Qwen3-Reranker's prompt; an
embedding model scores a pair by the cosine similarity of the two embeddings."""

from __future__ import annotations

import time
import uuid
from typing import Any

import numpy as np

from folio.frontend.engine_api import Engine
from folio.frontend.openai.errors import ApiError, invalid
from folio.frontend.openai.pooling.pool import (pool, pooling_task, prompt_ids,
                                                rerank_prompts, resolve_score_ids, usage)
from folio.frontend.openai.pooling.requests import (EmbeddingRequest, RerankRequest,
                                                    ScoreRequest)
from folio.shared.pooling.requests import pooling_params
from folio.shared.pooling.vectors import embedding, encode, score


async def create_embeddings(engine: Engine, request: EmbeddingRequest, model: str,
                            lora: str | None) -> dict[str, Any]:
    task = pooling_task(engine, "/v1/embeddings")
    if task.scores:
        raise ApiError(400, "this model is a reranker (scored from the logits of "
                       f"{' and '.join(map(repr, task.score_tokens))}); /v1/embeddings needs "
                       "an embedding model: use /v1/rerank or /v1/score", "model",
                       "wrong_runner")
    if request.dimensions is not None:
        problem = task.dimensions_problem(request.dimensions)
        if problem is not None:
            raise invalid(problem, "dimensions")
    params = pooling_params(task, lora)
    prompts = await prompt_ids(engine, request.inputs, params, "input")
    vectors = await pool(engine, prompts, params)
    data = [{"object": "embedding", "index": i,
             "embedding": encode(embedding(v, task.normalize, request.dimensions),
                                 request.encoding_format)}
            for i, v in enumerate(vectors)]
    return {"object": "list", "data": data, "model": model, "usage": usage(prompts)}


async def pair_scores(engine: Engine, pairs: list[tuple[str, str]],
                      instruction: str | None, lora: str | None, route: str
                      ) -> tuple[list[float], dict[str, Any]]:
    """Each (query, document) pair's score, and the usage."""
    task = pooling_task(engine, route)
    if task.scores:
        params = pooling_params(task, lora, resolve_score_ids(engine, task))
        prompts = await prompt_ids(engine, rerank_prompts(pairs, instruction), params,
                                   "documents", raw_text=True)
        return [score(v) for v in await pool(engine, prompts, params)], usage(prompts)
    if instruction is not None:
        raise invalid("instruction is a reranker's; this model embeds", "instruction")
    texts = list(dict.fromkeys(t for pair in pairs for t in pair))   # each text once
    params = pooling_params(task, lora)
    prompts = await prompt_ids(engine, texts, params, "documents")
    vectors = {t: embedding(v, True) for t, v in zip(texts, await pool(engine, prompts,
                                                                          params))}
    return [float(np.dot(vectors[a], vectors[b])) for a, b in pairs], usage(prompts)


async def create_rerank(engine: Engine, request: RerankRequest, model: str,
                        lora: str | None) -> dict[str, Any]:
    pairs = [(request.query, d) for d in request.documents]
    scores, used = await pair_scores(engine, pairs, request.instruction, lora, "/v1/rerank")
    order = sorted(range(len(scores)), key=lambda i: -scores[i])[:request.top_n]
    results = []
    for i in order:
        entry: dict[str, Any] = {"index": i, "relevance_score": scores[i]}
        if request.return_documents:
            entry["document"] = {"text": request.documents[i]}
        results.append(entry)
    return {"id": f"rerank-{uuid.uuid4().hex}", "model": model, "results": results,
            "usage": used}


async def create_score(engine: Engine, request: ScoreRequest, model: str,
                       lora: str | None) -> dict[str, Any]:
    scores, used = await pair_scores(engine, request.pairs, request.instruction, lora,
                                     "/v1/score")
    return {"id": f"score-{uuid.uuid4().hex}", "object": "list", "created": int(time.time()),
            "model": model,
            "data": [{"index": i, "object": "score", "score": s} for i, s in enumerate(scores)],
            "usage": used}
