"""Pooling models (docs/serving.md, "Embeddings, rerank and score"): what a checkpoint
declares it is for (task.py), what the executor returns for a pooled request and how it
becomes an answer (vectors.py), and the prompt a decoder reranker reads (rerank_prompt.py).
No torch here: the frontend, the scheduler's peers and folio.LLM read it alike."""
