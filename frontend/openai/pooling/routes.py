"""The pooling endpoints, for frontend/http/routes.py to register: (path, the body's
parser, the work that answers it as create(engine, parsed, model name, LoRA adapter))."""

from __future__ import annotations

from folio.frontend.openai.pooling.answers import (create_embeddings, create_rerank,
                                                   create_score)
from folio.frontend.openai.pooling.requests import (EmbeddingRequest, RerankRequest,
                                                    ScoreRequest)

# Jina's and Cohere's clients post to /v1/rerank, /rerank or /v2/rerank; vLLM's to /score.
POOLING_ENDPOINTS = (
    ("/v1/embeddings", EmbeddingRequest.parse, create_embeddings),
    ("/v1/rerank", RerankRequest.parse, create_rerank),
    ("/rerank", RerankRequest.parse, create_rerank),
    ("/v2/rerank", RerankRequest.parse, create_rerank),
    ("/v1/score", ScoreRequest.parse, create_score),
    ("/score", ScoreRequest.parse, create_score),
)
