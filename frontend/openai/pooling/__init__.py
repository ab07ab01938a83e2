"""/v1/embeddings (OpenAI's shape), /v1/rerank (Jina's and Cohere's) and /v1/score
(vLLM's), served by the pooling runner (shared/pooling/, executor/pooling/):
requests.py parses each body (every field honoured or refused by name), pool.py submits
the prompts and collects their vectors, answers.py shapes the answers, routes.py has the
handlers frontend/http/routes.py registers."""
