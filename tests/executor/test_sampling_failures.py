"""Reliability IV (issue 25, item 1): one request cannot take everyone down through sampling.

A sampling parameter that would make float32 logits non-finite is refused at the edge
(naming the field); a row whose logits are non-finite anyway (the model's own NaN) fails
that request alone, with a clear error, while the step and its bystanders go on.
"""

from __future__ import annotations

import asyncio
import json
import shutil
from pathlib import Path

import httpx
import pytest
import torch

from folio.executor.input_batch import CachedRequest
from folio.executor.sampler import NO_TOKEN, NOT_FINITE, Sampler, inverse_cdf
from folio import SamplingParams
from folio.shared.protocol import messages as m
from folio.shared.protocol.step import StepResult
from folio.shared.protocol.wire import unpack
from tests.http_server import HttpServer

VOCAB = 64
POISON = 7   # the token whose embedding is NaN in the poisoned checkpoint


def _request(row: int, params: SamplingParams) -> CachedRequest:
    return CachedRequest(row, row, [1, 2, 3], 3, 3, [0], params)


@pytest.mark.parametrize("value", [1e-300, 1e-38, 0.001])
def test_a_repetition_penalty_that_breaks_float32_is_refused(value):
    with pytest.raises(ValueError, match=r"repetition_penalty must be in \[0.01, 100\]"):
        SamplingParams(repetition_penalty=value, temperature=1.0)
    SamplingParams(repetition_penalty=0.01)   # the edge itself is fine


def test_every_allowed_extreme_keeps_the_logits_finite():
    """The widest settings the checks allow, together, on logits as large as a model's."""
    logits = torch.full((1, VOCAB), 50.0)
    logits[0, 5] = -50.0
    params = SamplingParams(temperature=1e-5 * 1.01, repetition_penalty=0.01,
                            presence_penalty=-2, frequency_penalty=-2, top_p=1e-9,
                            min_p=1.0, logit_bias={3: 100.0, 5: -100.0})
    batch = Sampler(torch.device("cpu"), 0, (0,)).sample(logits, [_request(0, params)])
    assert batch.failed == {} and 0 <= batch.tokens[0] < VOCAB


def test_a_non_finite_row_fails_alone_and_the_others_sample_as_they_would():
    sampler = Sampler(torch.device("cpu"), 0, (0,))
    torch.manual_seed(0)
    logits = torch.randn(6, VOCAB)
    logits[0, 9] = float("nan")            # sampled, a NaN from the model
    logits[2, 4] = float("inf")            # sampled, +inf
    logits[4, :] = float("nan")            # greedy, all NaN
    seeded = SamplingParams(temperature=0.8, seed=11)
    greedy = SamplingParams(temperature=0)
    params = [seeded, seeded, seeded, greedy, greedy,
              SamplingParams(temperature=0, logit_bias={t: -100.0 for t in range(VOCAB)})]
    logits[5, :] = float("-inf")          # greedy, every token banned (e.g. by a grammar)
    requests = [_request(i, p) for i, p in enumerate(params)]
    batch = sampler.sample(logits.clone(), requests)
    assert batch.failed == {0: NOT_FINITE, 2: NOT_FINITE, 4: NOT_FINITE, 5: NO_TOKEN}
    assert all(0 <= t < VOCAB for t in batch.tokens)
    # The bystanders: the seeded row draws what it draws alone, the greedy row its argmax.
    alone = Sampler(torch.device("cpu"), 0, (0,)).sample(logits[1:2].clone(), [requests[1]])
    assert batch.tokens[1] == alone.tokens[0] and alone.failed == {}
    assert batch.tokens[3] == int(logits[3].argmax())


def test_failed_rows_have_no_logprobs_and_the_others_do():
    logits = torch.randn(2, VOCAB)
    logits[0, 0] = float("nan")
    params = SamplingParams(temperature=1.0, logprobs=2)
    batch = Sampler(torch.device("cpu"), 0, (0,)).sample(
        logits, [_request(0, params), _request(1, params)])
    assert list(batch.failed) == [0]
    assert batch.logprobs[0] is None and batch.logprobs[1] is not None


def test_the_inverse_cdf_never_returns_the_vocabulary_size():
    probs = torch.full((2, VOCAB), float("nan"))
    probs[1] = 1.0 / VOCAB
    tokens = inverse_cdf(probs, torch.tensor([[0.5], [0.999]]))
    assert tokens.max() < VOCAB


def test_a_failed_request_crosses_the_wire_and_the_scheduler_ends_it_alone():
    from folio.scheduler.scheduler import Scheduler
    from folio.shared.config import SchedulerConfig
    from folio.shared.outputs import FinishReason

    result = StepResult(3, [1], [5], failed=[(0, NOT_FINITE)])
    _, body = m.decode(m.encode_result(result), frozenset({"result"}))
    assert m.decode_result(body).failed == [(0, NOT_FINITE)]

    scheduler = Scheduler(SchedulerConfig(num_kv_blocks=16, block_size=4, max_model_len=64))
    scheduler.add_request("bad", [1, 2, 3], SamplingParams(max_tokens=4))
    scheduler.add_request("good", [1, 2, 3], SamplingParams(max_tokens=4))
    plan = scheduler.schedule()
    handles = {r.handle: r for r in plan.new_requests}
    bad, good = sorted(handles)
    outputs = list(scheduler.update(plan, StepResult(plan.step_id, [good], [9],
                                                     failed=[(bad, NOT_FINITE)])))
    ended = {o.request_id: o for o in outputs if o.finished}
    assert ended["bad"].finish_reason is FinishReason.ERROR
    assert ended["bad"].error == NOT_FINITE
    assert "good" not in ended and scheduler.has_unfinished_requests()
    assert bad in scheduler.schedule().dropped_handles   # the executor forgets it


# ---- end to end: a model whose NaN reaches one request's logits only -----------------------

@pytest.fixture(scope="module")
def poisoned_dir(tmp_path_factory, llama_dir) -> Path:
    """The tiny Llama with token POISON's embedding NaN: any request whose context holds
    POISON gets NaN logits; the others are untouched (attention is per request)."""
    from safetensors.torch import load_file, save_file

    path = tmp_path_factory.mktemp("poisoned")
    for item in Path(llama_dir).iterdir():
        shutil.copy(item, path / item.name)
    weights = load_file(path / "model.safetensors")
    weights["model.embed_tokens.weight"][POISON] = float("nan")
    save_file(weights, path / "model.safetensors", metadata={"format": "pt"})
    return path


@pytest.fixture(scope="module")
def server(tmp_path_factory, poisoned_dir):
    srv = HttpServer(poisoned_dir, tmp_path_factory.mktemp("rel4s"), "--num-kv-blocks", "256",
                     "--served-model-name", "m")
    try:
        srv.wait_ready()
        yield srv
    finally:
        srv.stop()


@pytest.mark.slow
def test_an_extreme_penalty_is_refused_at_the_http_edge_and_by_the_sdk(server):
    for route, base in (("/v1/completions", {"prompt": "x"}),
                        ("/v1/chat/completions",
                         {"messages": [{"role": "user", "content": "x"}]})):
        for value in (1e-300, 1e-38):
            response = httpx.post(f"{server.base}{route}", json={
                "model": "m", **base, "repetition_penalty": value, "temperature": 1,
                "max_tokens": 4}, timeout=60)
            assert response.status_code == 400, response.text
            assert "repetition_penalty" in response.json()["error"]["message"]
    with pytest.raises(ValueError, match="repetition_penalty"):
        SamplingParams(repetition_penalty=1e-300)   # the SDK's own check, before sending
    # A client that skips it: the gateway's decode refuses the message by name.
    import zmq

    from folio.shared.protocol.wire import pack

    params = SamplingParams(max_tokens=4).to_dict()
    params["repetition_penalty"] = 1e-300
    ctx = zmq.Context()
    sock = ctx.socket(zmq.DEALER)
    sock.setsockopt(zmq.LINGER, 0)
    sock.setsockopt(zmq.RCVTIMEO, 30_000)
    try:
        sock.connect(server.zmq_address)
        sock.send(pack("generate", {"id": "raw-1", "prompt": "x", "params": params,
                                    "stream": False}))
        _, reply = unpack(sock.recv())
        assert "repetition_penalty" in str(reply), reply
    finally:
        sock.close()
        ctx.term()


@pytest.mark.slow
def test_nan_logits_fail_that_request_and_bystanders_stream_on(server, tokenizer_dir):
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(str(tokenizer_dir))
    clean = [t for t in tokenizer.encode("The while statement repeats a block")
             if t != POISON]
    bystander = {"model": "m", "prompt": clean, "max_tokens": 24, "temperature": 0,
                 "ignore_eos": True}
    alone = httpx.post(f"{server.base}/v1/completions", json=bystander, timeout=120).json()
    expected = alone["choices"][0]["text"]

    async def run() -> tuple[list, list]:
        async with httpx.AsyncClient(timeout=120) as client:
            async def stream_text() -> tuple[str, str | None]:
                text, finish = "", None
                async with client.stream("POST", f"{server.base}/v1/completions",
                                         json={**bystander, "stream": True}) as response:
                    async for line in response.aiter_lines():
                        if line.startswith("data: {"):
                            choice = json.loads(line[6:])["choices"][0]
                            text += choice["text"]
                            finish = choice["finish_reason"] or finish
                return text, finish

            async def poisoned(i: int):
                return await client.post(f"{server.base}/v1/completions", json={
                    "model": "m", "prompt": clean[:2] + [POISON] + clean[2:],
                    "max_tokens": 16, "temperature": 1, "seed": i})

            streams = [asyncio.create_task(stream_text()) for _ in range(4)]
            attacks = [asyncio.create_task(poisoned(i)) for i in range(4)]
            return await asyncio.gather(*streams), await asyncio.gather(*attacks)

    streams, attacks = asyncio.run(run())
    assert streams == [(expected, "length")] * 4
    for response in attacks:
        assert response.status_code >= 400, response.text
        assert "NaN or infinite" in response.text, response.text
    health = httpx.get(f"{server.base}/health", timeout=30)
    assert health.status_code == 200, health.text
    again = httpx.post(f"{server.base}/v1/completions", json=bystander, timeout=120).json()
    assert again["choices"][0]["text"] == expected
