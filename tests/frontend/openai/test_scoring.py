"""Prompt scoring through echo + logprobs on /v1/completions, checked against transformers'
log-softmax on the same float32 checkpoint, with the official `openai` client."""

from __future__ import annotations

import math

import httpx
import pytest

from tests.frontend.openai.served import KEY, MODEL

pytestmark = pytest.mark.slow
TOL = 1e-3
CONTEXT = "The for statement in Python differs a bit from what you may be used to"
CONTINUATION = " in C or Pascal."


@pytest.fixture(scope="module")
def reference(llama_dir):
    """(tokenizer, ids -> per-position log-softmax rows) from transformers itself."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(llama_dir)
    model = AutoModelForCausalLM.from_pretrained(llama_dir, torch_dtype=torch.float32).eval()

    def log_softmax(ids: list[int]) -> torch.Tensor:
        with torch.no_grad():
            logits = model(torch.tensor([ids])).logits[0].float()
        return torch.log_softmax(logits, dim=-1)

    return tokenizer, log_softmax


def _prompt_logprobs(rows, ids: list[int]) -> list[float]:
    """log p(ids[i] | ids[:i]) for i >= 1."""
    return [rows[i - 1, ids[i]].item() for i in range(1, len(ids))]


def _check_offsets(text: str, logprobs) -> None:
    assert logprobs.text_offset[0] == 0
    for token, offset in zip(logprobs.tokens, logprobs.text_offset):
        assert text[offset:offset + len(token)] == token


def test_echo_string_prompt_matches_transformers(client, reference):
    tokenizer, log_softmax = reference
    ids = tokenizer.encode(CONTEXT)
    rows = log_softmax(ids)
    choice = client.completions.create(model=MODEL, prompt=CONTEXT, echo=True, logprobs=3,
                                       max_tokens=2, temperature=0).choices[0]
    lp = choice.logprobs
    assert len(lp.tokens) == len(ids) + 2
    assert lp.token_logprobs[0] is None and lp.top_logprobs[0] is None
    assert lp.tokens[:len(ids)] == [tokenizer.decode([t]) for t in ids]
    expected = _prompt_logprobs(rows, ids)
    assert max(abs(a - b) for a, b in zip(lp.token_logprobs[1:len(ids)], expected)) < TOL
    first_generated = int(rows[-1].argmax())   # greedy: the model's own next token
    assert lp.tokens[len(ids)] == tokenizer.decode([first_generated])
    assert abs(lp.token_logprobs[len(ids)] - rows[-1, first_generated].item()) < TOL
    # lm-evaluation-harness' is_greedy: the chosen logprob equals the best in top_logprobs
    assert max(lp.top_logprobs[len(ids)].values()) == lp.token_logprobs[len(ids)]
    for i in range(1, len(lp.tokens)):
        top = lp.top_logprobs[i]
        assert len(top) in (3, 4)                       # k, plus the chosen one if not in it
        assert top[lp.tokens[i]] == pytest.approx(lp.token_logprobs[i])
    best = rows[len(ids) // 2 - 1].topk(3)           # a prompt position's top 3
    top = lp.top_logprobs[len(ids) // 2]
    for value, token_id in zip(best.values.tolist(), best.indices.tolist()):
        assert abs(top[tokenizer.decode([token_id])] - value) < TOL
    assert choice.text.startswith(CONTEXT) and len(choice.text) > len(CONTEXT)
    _check_offsets(choice.text, lp)


def test_echo_token_id_prompt_and_score_only(client, reference):
    tokenizer, log_softmax = reference
    ids = tokenizer.encode(CONTEXT)
    expected = _prompt_logprobs(log_softmax(ids), ids)
    response = client.completions.create(model=MODEL, prompt=ids, echo=True, logprobs=1,
                                         max_tokens=0)
    choice = response.choices[0]
    assert choice.text == tokenizer.decode(ids) and choice.finish_reason == "length"
    lp = choice.logprobs
    assert len(lp.tokens) == len(ids) and lp.token_logprobs[0] is None
    assert max(abs(a - b) for a, b in zip(lp.token_logprobs[1:], expected)) < TOL
    assert response.usage.completion_tokens == 0
    assert response.usage.prompt_tokens == response.usage.total_tokens == len(ids)
    _check_offsets(choice.text, lp)
    plain = client.completions.create(model=MODEL, prompt=CONTEXT, echo=True, max_tokens=0)
    assert plain.choices[0].text == CONTEXT and plain.choices[0].logprobs is None


def test_batched_prompts_with_n(client, reference):
    tokenizer, log_softmax = reference
    prompts = ["def f(x):\n    return x", "A list is a sequence"]
    response = client.completions.create(model=MODEL, prompt=prompts, n=2, echo=True,
                                         logprobs=2, max_tokens=3, temperature=1.0, seed=3)
    assert sorted(c.index for c in response.choices) == [0, 1, 2, 3]
    for choice in response.choices:
        prompt = prompts[choice.index // 2]
        ids = tokenizer.encode(prompt)
        expected = _prompt_logprobs(log_softmax(ids), ids)
        lp = choice.logprobs
        assert len(lp.tokens) == len(ids) + 3       # each prompt token once, then 3 sampled
        assert lp.token_logprobs[0] is None
        assert max(abs(a - b) for a, b in zip(lp.token_logprobs[1:len(ids)], expected)) < TOL
        assert all(v is not None and v <= 0 for v in lp.token_logprobs[1:])
        assert choice.text.startswith(prompt)
        _check_offsets(choice.text, lp)
    assert response.usage.completion_tokens == 12


@pytest.mark.parametrize("max_tokens", [0, 1])
def test_loglikelihood_the_harness_way(client, reference, max_tokens):
    """lm-evaluation-harness' local-completions payload (token-id lists, batched, seed,
    logprobs 1, echo): the sum of token_logprobs over each continuation (the generated
    token dropped when there is one) is the model's loglikelihood."""
    tokenizer, log_softmax = reference
    pairs = [(CONTEXT, CONTINUATION), ("A tuple is", " an immutable sequence")]
    requests, expected = [], []
    for context, continuation in pairs:
        context_ids = tokenizer.encode(context)
        whole = context_ids + tokenizer.encode(continuation)
        rows = log_softmax(whole)
        requests.append((len(context_ids), whole))
        expected.append(sum(rows[i - 1, whole[i]].item()
                            for i in range(len(context_ids), len(whole))))
    response = client.completions.create(model=MODEL, prompt=[w for _, w in requests],
                                         echo=True, logprobs=1, max_tokens=max_tokens,
                                         temperature=0, seed=1234)
    choices = sorted(response.choices, key=lambda c: c.index)
    for choice, (ctxlen, whole), want in zip(choices, requests, expected):
        values = choice.logprobs.token_logprobs[ctxlen:]
        if max_tokens:
            values = values[:-1]
        assert len(values) == len(whole) - ctxlen
        assert abs(sum(values) - want) < TOL
        assert want < -1.0 and math.isfinite(want)   # a real sum, not a zero


def test_score_only_refusals(server):
    def post(body):
        return httpx.post(f"{server.base}/v1/completions", json={"model": MODEL, **body},
                          headers={"Authorization": f"Bearer {KEY}"}, timeout=30)

    no_echo = post({"prompt": "x", "max_tokens": 0})
    assert no_echo.status_code == 400 and no_echo.json()["error"]["param"] == "max_tokens"
    with_min = post({"prompt": "x", "max_tokens": 0, "echo": True, "min_tokens": 1})
    assert with_min.status_code == 400 and with_min.json()["error"]["param"] == "min_tokens"
    full = post({"prompt": [5] * 1024, "max_tokens": 0, "echo": True})
    assert full.status_code == 400
    assert full.json()["error"]["code"] == "context_length_exceeded"
    streamed = post({"prompt": "x", "echo": True, "stream": True})
    assert streamed.status_code == 400 and streamed.json()["error"]["param"] == "echo"
