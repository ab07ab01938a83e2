"""The SDK's pooling requests at the ZeroMQ gateway (frontend/zmq_gateway.py): a `generate`
with `pooling` "embed" or "score" (docs/protocol.md §4) becomes the same prompt-only request
the HTTP API sends, and its final reply carries the answer's vector (`pooled`).

An SDK score runs on a scorer (decoder reranker) only: one request per pair. On an
embedding model it is refused by name; compare Client.embed's vectors instead."""

from __future__ import annotations

from typing import Callable

import numpy as np

from folio.frontend.engine_api import Engine
from folio.frontend.input_processor import ProcessedPrompt
from folio.shared.pooling.requests import pooling_params, score_token_ids
from folio.shared.pooling.rerank_prompt import rerank_prompt
from folio.shared.pooling.vectors import embedding, from_bytes, to_bytes


def runner_problem(engine: Engine, pooling: str | None) -> str | None:
    """Why this engine cannot serve a request of this kind (None: it can)."""
    task = engine.pooling
    if pooling is None:
        return None if task is None else ("this server runs the pooling runner (embed, "
                                          "score); it does not generate")
    if task is None:
        return "this server runs the generate runner; it does not pool (embed, score)"
    if pooling == "embed" and task.scores:
        return "this model is a reranker: use Client.score"
    if pooling == "score" and not task.scores:
        return ("this model embeds: Client.score needs a reranker; compare Client.embed's "
                "vectors (cosine) instead")
    return None


def prepare_pooled(engine: Engine, request) -> ProcessedPrompt:
    """The request's prompt ids, checked as over HTTP; its params set to the pooling
    request's (the client's are not read). ValueError names what is wrong."""
    task = engine.pooling
    inputs, facts = engine.inputs, engine.facts
    if request.pooling == "embed":
        if request.dimensions is not None:
            problem = task.dimensions_problem(request.dimensions)
            if problem is not None:
                raise ValueError(problem)
        params = pooling_params(task, request.params.lora)
        ids = inputs.tokenize(prompt=request.prompt, token_ids=request.prompt_token_ids)
    else:
        score_ids = score_token_ids(engine.tokenizer, task)   # ValueError: refused
        params = pooling_params(task, request.params.lora, score_ids)
        text = rerank_prompt(request.prompt, request.text_2, request.instruction)
        inputs.check_text(len(text), facts)
        ids = engine.tokenizer.encode(text, add_special_tokens=False)
    inputs.check_prompt(ids, params, facts, score_only=True)
    inputs.check_params(params, facts)
    request.params = params
    return ProcessedPrompt(ids, None)


def pooled_answer(engine: Engine, request) -> Callable[[bytes], bytes]:
    """The final reply's vector from the engine's: an embedding, or the one score."""
    task = engine.pooling
    if request.pooling == "embed":
        return lambda data: to_bytes(embedding(data, task.normalize, request.dimensions))
    return lambda data: to_bytes(np.asarray([from_bytes(data)[1]]))
