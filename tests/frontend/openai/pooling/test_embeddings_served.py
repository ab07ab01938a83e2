"""/v1/embeddings, /v1/score and /v1/rerank of an embedding model through a real
`folio serve` (one for the module): a tiny random Qwen3Model whose sentence-transformers
files declare last-token pooling and normalisation, and whose config.json declares
Matryoshka dimensions. Vectors are compared with transformers' own (cosine >= 0.99999 in
float32), through the `openai` SDK, raw HTTP and LangChain's OpenAIEmbeddings."""

from __future__ import annotations

import base64
import json
import re
import time

import httpx
import numpy as np
import pytest

from tests.http_server import openai_client, serving
from tests.pooling_models import cosine, hf_embeddings, make_embedding_model

KEY = "sk-folio-pooling"
NAME = "tiny-embed"
TEXTS = ["The for statement iterates over a sequence.",
         "A while loop repeats while its condition holds. " * 6,
         "x"]


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory, tokenizer_dir):
    path = make_embedding_model(tokenizer_dir, tmp_path_factory.mktemp("embed"))
    config = json.loads((path / "config.json").read_text())
    (path / "config.json").write_text(json.dumps(config | {"is_matryoshka": True}))
    return path


@pytest.fixture(scope="module")
def server(tmp_path_factory, model_dir):
    # A small token budget: the longer inputs run in chunks, sharing steps with the others.
    with serving(model_dir, tmp_path_factory.mktemp("embed-serve"), "--api-key", KEY,
                 "--served-model-name", NAME, "--num-kv-blocks", "96",
                 "--max-num-batched-tokens", "48", "--max-model-len", "256") as srv:
        yield srv


@pytest.fixture(scope="module")
def client(server):
    return openai_client(server, KEY)


@pytest.fixture(scope="module")
def ids(model_dir):
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(str(model_dir))
    return [tokenizer.encode(text) for text in TEXTS]


@pytest.fixture(scope="module")
def expected(model_dir, ids):
    return hf_embeddings(model_dir, ids, "last")


def _post(server, path: str, body: dict) -> httpx.Response:
    return httpx.post(f"{server.base}{path}", json=body, timeout=60,
                      headers={"Authorization": f"Bearer {KEY}"})


def test_openai_sdk_embeddings_equal_transformers(client, expected, ids):
    # The SDK asks for base64 and decodes it itself: that path is what it checks.
    response = client.embeddings.create(model=NAME, input=TEXTS)
    assert [d.index for d in response.data] == [0, 1, 2]
    for data, reference in zip(response.data, expected):
        assert len(data.embedding) == 64
        assert cosine(data.embedding, reference) >= 0.99999
        assert abs(np.linalg.norm(data.embedding) - 1) < 1e-5
    assert response.usage.prompt_tokens == sum(map(len, ids))
    assert response.model == NAME


def test_token_arrays_and_float_format(client, server, expected, ids):
    one = client.embeddings.create(model=NAME, input=ids[0], encoding_format="float")
    assert cosine(one.data[0].embedding, expected[0]) >= 0.99999
    many = _post(server, "/v1/embeddings", {"input": ids, "model": NAME}).json()
    assert [cosine(d["embedding"], e) for d, e in zip(many["data"], expected)] \
        == pytest.approx([1, 1, 1], abs=1e-5)


def test_base64_and_matryoshka_dimensions(server, expected):
    body = {"input": TEXTS[0], "encoding_format": "base64", "dimensions": 16}
    data = _post(server, "/v1/embeddings", body).json()["data"][0]["embedding"]
    vector = np.frombuffer(base64.b64decode(data), dtype="<f4")
    truncated = expected[0][:16] / np.linalg.norm(expected[0][:16])
    assert vector.shape == (16,) and cosine(vector, truncated) >= 0.99999
    assert abs(np.linalg.norm(vector) - 1) < 1e-5


@pytest.mark.parametrize("body, param", [
    ({"input": ""}, "input"),
    ({"input": []}, "input"),
    ({"input": [[]]}, "input"),
    ({"input": 5}, "input"),
    ({"input": [1.5]}, "input"),
    ({"input": ["ok", 3]}, "input"),
    ({"input": [5000]}, "input"),                      # outside the vocabulary
    ({"input": [7] * 300}, "input"),                   # longer than max_model_len
    ({"input": "the " * 2000}, "input"),               # text too long to fit
    ({"input": "hi", "normalize": True}, "normalize"),  # unknown field, named
    ({"input": "hi", "encoding_format": "base65"}, "encoding_format"),
    ({"input": "hi", "dimensions": 0}, "dimensions"),
    ({"input": "hi", "dimensions": 65}, "dimensions"),
    ({"input": "hi", "dimensions": "8"}, "dimensions"),
])
def test_bad_input_is_a_400_in_openais_shape(server, body, param):
    response = _post(server, "/v1/embeddings", body)
    assert response.status_code == 400, response.text
    error = response.json()["error"]
    assert error["param"] == param and error["type"] == "invalid_request_error"
    assert error["message"]


def test_generating_on_the_pooling_runner_is_a_400_naming_it(server):
    for path, body in (("/v1/completions", {"prompt": "hi", "max_tokens": 2}),
                       ("/v1/chat/completions",
                        {"messages": [{"role": "user", "content": "hi"}]})):
        response = _post(server, path, body)
        assert response.status_code == 400
        error = response.json()["error"]
        assert error["code"] == "wrong_runner" and "pooling runner" in error["message"]


def test_score_and_rerank_by_cosine_similarity(server, expected):
    scores = _post(server, "/v1/score", {"text_1": TEXTS[0], "text_2": TEXTS,
                                         "model": NAME}).json()
    assert [d["score"] for d in scores["data"]] == pytest.approx(
        [cosine(expected[0], e) for e in expected], abs=1e-5)
    ranked = _post(server, "/v1/rerank", {"query": TEXTS[0], "documents": TEXTS[1:] + TEXTS[:1],
                                          "top_n": 2, "return_documents": False}).json()
    assert [r["index"] for r in ranked["results"]] == [2, int(cosine(expected[0], expected[1])
                                                              < cosine(expected[0], expected[2]))]
    assert all("document" not in r for r in ranked["results"])
    assert ranked["results"][0]["relevance_score"] == pytest.approx(1, abs=1e-5)


def test_langchain_openai_embeddings(server, expected):
    import langchain_openai as langchain

    embedder = langchain.OpenAIEmbeddings(model=NAME, base_url=f"{server.base}/v1",
                                          api_key=KEY, check_embedding_ctx_length=False,
                                          max_retries=0)
    documents = embedder.embed_documents(TEXTS)
    assert [cosine(d, e) for d, e in zip(documents, expected)] == pytest.approx(
        [1, 1, 1], abs=1e-5)
    assert cosine(embedder.embed_query(TEXTS[1]), expected[1]) >= 0.99999


def _poll(read, done, timeout_s: float = 30):
    """read() until done(value) or the deadline; returns the last value."""
    deadline = time.monotonic() + timeout_s
    while True:
        value = read()
        if done(value) or time.monotonic() > deadline:
            return value
        time.sleep(0.05)


def test_prefix_cache_metrics_and_no_leaked_block(server, client, expected, ids):
    from folio.client import Client

    def metric(name: str) -> float:
        text = httpx.get(f"{server.base}/metrics", timeout=10,
                         headers={"Authorization": f"Bearer {KEY}"}).text
        return sum(float(v) for v in re.findall(rf"^folio:{name}(?:{{[^}}]*}})? (\S+)$",
                                                text, re.M))

    def hits() -> int:   # the scheduler's counter, asked with the SDK's patient timeout
        with Client(server.zmq_address) as sdk:
            return sdk.health()["stats"]["prefix_cache_hits"]

    def kv_map() -> dict:
        return httpx.get(f"{server.base}/v1/kv/map", timeout=10,
                         headers={"Authorization": f"Bearer {KEY}"}).json()

    # Embedded once so its blocks are cached whatever ran before (alone, or after the
    # batched embedding of every text).
    client.embeddings.create(model=NAME, input=TEXTS[1])
    size = kv_map()["block_size"]
    # Read at once: the scheduler's shared stats answer is built again after a request
    # finished, so these counts include the one just answered (docs/protocol.md).
    before, finished = hits(), metric("request_success_total")
    again = client.embeddings.create(model=NAME, input=TEXTS[1])
    assert cosine(again.data[0].embedding, expected[1]) >= 0.99999
    # Every full block before the last token is a hit (the last is always computed).
    full = (len(ids[1]) - 1) // size * size
    assert hits() == before + full
    assert metric("request_success_total") == finished + 1
    # The page map is shared for 0.25 s whatever finished (a walk of every table).
    totals = _poll(kv_map, lambda m: m["totals"]["used"] == 0)["totals"]
    assert totals["used"] == 0 and totals["cached"] > 0


def test_the_sdk_embeds_and_refuses_by_runner(server, expected, ids):
    from folio.client import Client
    from folio.errors import FolioError

    with Client(server.zmq_address) as sdk:
        embedded = sdk.embed([TEXTS[0], ids[2]])
        assert [cosine(e.embedding, r) for e, r in zip(embedded, (expected[0], expected[2]))] \
            == pytest.approx([1, 1], abs=1e-5)
        assert embedded[0].usage.prompt_tokens == len(ids[0])
        short = sdk.embed(TEXTS[1], dimensions=8)[0].embedding
        assert len(short) == 8 and cosine(short, expected[1][:8]) >= 0.99999
        for call, words in ((lambda: sdk.generate("hi"), "pooling runner"),
                            (lambda: sdk.score("a", "b"), "this model embeds"),
                            (lambda: sdk.embed([[5000]]), "vocabulary")):
            with pytest.raises(FolioError, match=words):
                call()
