"""/v1/rerank and /v1/score of a decoder reranker through a real `folio serve` (one for
the module): a tiny random Qwen3ForCausalLM whose config.json declares its two score tokens
(classifier_from_token, vLLM's key), scored as Qwen3-Reranker is: the softmax of the
next-token logits of those tokens after the reranker's prompt. transformers computes the
same on the same prompts."""

from __future__ import annotations

import json

import httpx
import pytest

from folio.shared.pooling.rerank_prompt import rerank_prompt
from tests.http_server import serving
from tests.pooling_models import hf_rerank_scores, make_reranker

KEY = "sk-folio-rerank"
# Single tokens of the tests' tokenizer ("yes" and "no" are two each there).
AGAINST, FOR = "not", "is"
QUERY = "How does a for statement iterate?"
DOCUMENTS = ["The for statement iterates over the items of a sequence.",
             "Exceptions are raised with the raise statement.",
             "A while loop repeats while its condition holds."]


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory, tokenizer_dir):
    path = make_reranker(tokenizer_dir, tmp_path_factory.mktemp("rerank"))
    config = json.loads((path / "config.json").read_text())
    (path / "config.json").write_text(json.dumps(config | {
        "classifier_from_token": [AGAINST, FOR]}))
    return path


@pytest.fixture(scope="module")
def server(tmp_path_factory, model_dir):
    with serving(model_dir, tmp_path_factory.mktemp("rerank-serve"), "--api-key", KEY,
                 "--num-kv-blocks", "128", "--max-model-len", "512") as srv:
        yield srv


@pytest.fixture(scope="module")
def tokenizer(model_dir):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(model_dir))


def _expected(model_dir, tokenizer, pairs, instruction=None):
    prompts = [tokenizer.encode(rerank_prompt(q, d, instruction), add_special_tokens=False)
               for q, d in pairs]
    against, for_ = (tokenizer.encode(t, add_special_tokens=False)[0] for t in (AGAINST, FOR))
    return hf_rerank_scores(model_dir, prompts, against, for_)


def _post(server, path: str, body: dict) -> httpx.Response:
    return httpx.post(f"{server.base}{path}", json=body, timeout=60,
                      headers={"Authorization": f"Bearer {KEY}"})


def test_rerank_scores_equal_transformers(server, model_dir, tokenizer):
    expected = _expected(model_dir, tokenizer, [(QUERY, d) for d in DOCUMENTS])
    answer = _post(server, "/v1/rerank", {"query": QUERY, "documents": DOCUMENTS}).json()
    order = sorted(range(3), key=lambda i: -expected[i])
    assert [r["index"] for r in answer["results"]] == order
    for result in answer["results"]:
        assert result["relevance_score"] == pytest.approx(expected[result["index"]], abs=1e-5)
        assert result["document"] == {"text": DOCUMENTS[result["index"]]}
    assert answer["usage"]["prompt_tokens"] > 0
    top = _post(server, "/rerank", {"query": QUERY, "documents": [{"text": d} for d in
                                                                  DOCUMENTS],
                                    "top_n": 1, "return_documents": False}).json()
    assert [r["index"] for r in top["results"]] == order[:1]
    assert "document" not in top["results"][0]


def test_score_pairs_with_an_instruction_equal_transformers(server, model_dir, tokenizer):
    instruction = "Judge whether the passage is about loops"
    pairs = list(zip([QUERY, "raise"], DOCUMENTS[:2]))
    expected = _expected(model_dir, tokenizer, pairs, instruction)
    answer = _post(server, "/v1/score", {"text_1": [q for q, _ in pairs],
                                         "text_2": [d for _, d in pairs],
                                         "instruction": instruction}).json()
    assert [d["index"] for d in answer["data"]] == [0, 1]
    assert [d["score"] for d in answer["data"]] == pytest.approx(expected, abs=1e-5)


@pytest.mark.parametrize("path, body, param", [
    ("/v1/rerank", {"query": "", "documents": ["a"]}, "query"),
    ("/v1/rerank", {"query": "q", "documents": []}, "documents"),
    ("/v1/rerank", {"query": "q", "documents": ["a", 3]}, "documents"),
    ("/v1/rerank", {"query": "q", "documents": ["a"], "top_n": 0}, "top_n"),
    ("/v1/rerank", {"query": "q", "documents": ["a"], "rank_fields": ["x"]}, "rank_fields"),
    ("/v1/rerank", {"query": "q", "documents": ["a " * 3000]}, "documents"),
    ("/v1/score", {"text_1": ["a", "b"], "text_2": ["c", "d", "e"]}, "text_2"),
    ("/v1/score", {"text_1": "a"}, "text_2"),
    ("/v1/embeddings", {"input": "a"}, "model"),   # a reranker does not embed
])
def test_bad_input_is_a_400_in_openais_shape(server, path, body, param):
    response = _post(server, path, body)
    assert response.status_code == 400, response.text
    error = response.json()["error"]
    assert error["param"] == param and error["message"]


def test_the_sdk_scores(server, model_dir, tokenizer):
    from folio.client import Client
    from folio.errors import FolioError

    expected = _expected(model_dir, tokenizer, [(QUERY, d) for d in DOCUMENTS])
    with Client(server.zmq_address) as sdk:
        scores = sdk.score(QUERY, DOCUMENTS)
        assert [s.score for s in scores] == pytest.approx(expected, abs=1e-5)
        with pytest.raises(FolioError, match="reranker"):
            sdk.embed("hi")


def test_nothing_leaked(server):
    totals = httpx.get(f"{server.base}/v1/kv/map", timeout=10,
                       headers={"Authorization": f"Bearer {KEY}"}).json()["totals"]
    assert totals["used"] == 0 and totals["requests"] == 0
