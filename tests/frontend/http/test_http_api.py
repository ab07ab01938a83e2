"""The OpenAI-compatible HTTP API, driven by the official `openai` client and raw HTTP."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
import time

import httpx
import openai
import pytest
from prometheus_client.parser import text_string_to_metric_families

from folio import SamplingParams
from folio.client import Client
from tests.http_server import ROOT, free_port, openai_client, serving

pytestmark = pytest.mark.slow
KEY = "sk-folio-test"
MODEL = "tiny"


@pytest.fixture(scope="module")
def server(tmp_path_factory, llama_dir):
    with serving(llama_dir, tmp_path_factory.mktemp("http"), "--api-key", KEY,
                 "--served-model-name", MODEL, "--num-kv-blocks", "512",
                 "--max-num-seqs", "4", "--max-queued-requests", "6") as srv:
        yield srv


@pytest.fixture(scope="module")
def client(server):
    return openai_client(server, KEY)


def _stats(server) -> dict:
    with Client(server.zmq_address) as sdk:
        return sdk.health()["stats"]


def _idle(server, timeout: float = 60.0) -> dict:
    deadline = time.monotonic() + timeout
    while True:
        stats = _stats(server)
        if (stats["num_running"] == stats["num_waiting"] == 0) or time.monotonic() > deadline:
            return stats
        time.sleep(0.05)


def test_models(client):
    models = client.models.list()
    assert [m.id for m in models.data] == [MODEL]


def test_completion_greedy_equals_the_sdk(client, server):
    response = client.completions.create(model=MODEL, prompt="The for statement",
                                         max_tokens=12, temperature=0)
    with Client(server.zmq_address) as sdk:
        expected = sdk.generate("The for statement", SamplingParams(temperature=0,
                                                                    max_tokens=12))
    choice = response.choices[0]
    assert choice.text == expected.text and choice.finish_reason == "length"
    assert response.object == "text_completion"
    assert response.usage.completion_tokens == 12
    assert response.usage.prompt_tokens == expected.usage.prompt_tokens
    assert response.usage.total_tokens == response.usage.prompt_tokens + 12


def test_completion_prompt_forms_n_and_echo(client):
    response = client.completions.create(model=MODEL, prompt=["a b", "c d"], n=2,
                                         max_tokens=4, temperature=0, echo=True)
    assert sorted(c.index for c in response.choices) == [0, 1, 2, 3]
    texts = {c.index: c.text for c in response.choices}
    assert texts[0] == texts[1] and texts[0].startswith("a b")     # greedy: equal samples
    assert texts[2].startswith("c d")
    assert response.usage.completion_tokens == 16
    ids = client.completions.create(model=MODEL, prompt=[[5, 6, 7], [8, 9]], max_tokens=3,
                                    temperature=0)
    assert len(ids.choices) == 2 and ids.usage.prompt_tokens == 5


def test_completion_stream_with_usage(client):
    stream = client.completions.create(model=MODEL, prompt="Hello", max_tokens=6,
                                       temperature=0, stream=True,
                                       stream_options={"include_usage": True})
    chunks = list(stream)
    text = "".join(c.choices[0].text for c in chunks if c.choices)
    finish = [c.choices[0].finish_reason for c in chunks if c.choices][-1]
    assert chunks[-1].usage.completion_tokens == 6 and not chunks[-1].choices
    whole = client.completions.create(model=MODEL, prompt="Hello", max_tokens=6,
                                      temperature=0)
    assert text == whole.choices[0].text and finish == "length"


def test_chat_stream_n2_logprobs_and_usage(client):
    messages = [{"role": "system", "content": "Be brief."},
                {"role": "user", "content": [{"type": "text", "text": "What is a list?"}]}]
    whole = client.chat.completions.create(model=MODEL, messages=messages, max_tokens=8,
                                           temperature=0, n=2, logprobs=True, top_logprobs=2)
    assert [c.index for c in whole.choices] == [0, 1]
    assert whole.choices[0].message.content == whole.choices[1].message.content
    assert whole.choices[0].message.role == "assistant"
    content = whole.choices[0].logprobs.content
    assert len(content) == 8 and all(len(t.top_logprobs) == 2 for t in content)
    assert all(t.logprob <= 0 for t in content)
    assert whole.usage.completion_tokens == 16
    stream = client.chat.completions.create(model=MODEL, messages=messages,
                                            max_completion_tokens=8, temperature=0,
                                            stream=True,
                                            stream_options={"include_usage": True})
    chunks = list(stream)
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert chunks[0].choices[0].delta.role == "assistant"
    assert text == whole.choices[0].message.content
    assert chunks[-1].usage.total_tokens == whole.usage.prompt_tokens + 8


def test_sdk_serves_n_as_http(client, server):
    """n > 1 over the ZeroMQ SDK: each sample its own output (and stream index), seeded
    samples the same as the HTTP API's for the same request."""
    prompt = "The for statement"
    with Client(server.zmq_address) as sdk:
        greedy = sdk.generate(prompt, SamplingParams(n=3, temperature=0, max_tokens=8))
        seeded = sdk.generate(prompt, SamplingParams(n=2, temperature=1.0, seed=7,
                                                     max_tokens=8))
        streamed: dict[int, str] = {}
        for delta in sdk.stream(prompt, SamplingParams(n=2, temperature=1.0, seed=7,
                                                       max_tokens=8)):
            streamed[delta.index] = streamed.get(delta.index, "") + delta.text
    http_greedy = client.completions.create(model=MODEL, prompt=prompt, max_tokens=8,
                                            temperature=0)
    http_seeded = client.completions.create(model=MODEL, prompt=prompt, max_tokens=8,
                                            temperature=1.0, seed=7, n=2)
    assert [o.index for o in greedy.outputs] == [0, 1, 2]
    assert [o.text for o in greedy.outputs] == [http_greedy.choices[0].text] * 3
    assert greedy.text == greedy.outputs[0].text
    assert greedy.usage.completion_tokens == 24
    expected = [c.text for c in sorted(http_seeded.choices, key=lambda c: c.index)]
    assert [o.text for o in seeded.outputs] == expected
    assert expected[0] != expected[1]   # two samples, not one sent twice
    assert streamed == dict(enumerate(expected))


def test_stop_and_seed(client):
    plain = client.completions.create(model=MODEL, prompt="The while", max_tokens=16,
                                      temperature=0).choices[0].text
    stop = plain[4:7]
    cut = client.completions.create(model=MODEL, prompt="The while", max_tokens=16,
                                    temperature=0, stop=[stop]).choices[0]
    assert cut.text == plain[:plain.index(stop)] and cut.finish_reason == "stop"
    seeded = [client.completions.create(model=MODEL, prompt="The while", max_tokens=10,
                                        temperature=1.0, seed=7).choices[0].text
              for _ in range(2)]
    assert seeded[0] == seeded[1]
    assert client.completions.create(
        model=MODEL, prompt="x", max_tokens=2, temperature=0,
        extra_body={"top_k": 5, "min_p": 0.1, "repetition_penalty": 1.2, "ignore_eos": True,
                    "min_tokens": 2}).usage.completion_tokens == 2


def test_async_client(server):
    async def run():
        client = openai.AsyncOpenAI(base_url=f"{server.base}/v1", api_key=KEY, max_retries=0)
        results = await asyncio.gather(*(client.chat.completions.create(
            model=MODEL, messages=[{"role": "user", "content": f"Question {i}"}],
            max_tokens=5, temperature=0) for i in range(4)))
        stream = await client.chat.completions.create(
            model=MODEL, messages=[{"role": "user", "content": "Question 0"}], max_tokens=5,
            temperature=0, stream=True)
        text = "".join([c.choices[0].delta.content or "" async for c in stream])
        await client.close()
        return results, text

    results, text = asyncio.run(run())
    assert all(r.usage.completion_tokens == 5 for r in results)
    assert text == results[0].choices[0].message.content


def _post(server, path: str, body, key: str | None = KEY, **kwargs) -> httpx.Response:
    headers = {"Authorization": f"Bearer {key}"} if key else {}
    return httpx.post(f"{server.base}{path}", content=body if isinstance(body, bytes)
                      else json.dumps(body), headers=headers, timeout=30, **kwargs)


def _error(response: httpx.Response) -> dict:
    body = response.json()
    assert set(body["error"]) == {"message", "type", "param", "code"}
    return body["error"]


@pytest.mark.parametrize("body, status, words", [
    ({"model": MODEL, "prompt": "x", "temperature": -1}, 400, "temperature must be >= 0"),
    ({"model": MODEL, "prompt": "x", "top_p": 2}, 400, "top_p must be in (0, 1]"),
    ({"model": MODEL, "prompt": "x", "n": 0}, 400, "n must be >= 1"),
    ({"model": MODEL, "prompt": "x", "logprobs": 50}, 400, "logprobs must be an integer"),
    ({"model": MODEL, "prompt": [5] * 1025}, 400, "max_model_len = 1024"),
    ({"model": MODEL, "prompt": "x", "logit_bias": {"99999": 1}}, 400, "outside the vocab"),
    ({"model": "gpt-9", "prompt": "x"}, 404, "does not exist"),
    ({"model": MODEL}, 400, "prompt must be"),
    ({"model": MODEL, "prompt": "x", "priority": "high"}, 400, "priority must be an integer"),
    # The server runs FCFS (the default): a priority is refused, not ignored.
    ({"model": MODEL, "prompt": "x", "priority": 3}, 400, "--scheduling-policy priority"),
])
def test_error_statuses(server, body, status, words):
    response = _post(server, "/v1/completions", body)
    assert response.status_code == status
    assert words in _error(response)["message"]


def test_auth_and_bad_json(server):
    assert _post(server, "/v1/completions", {"prompt": "x"}, key=None).status_code == 401
    assert _post(server, "/v1/completions", {"prompt": "x"}, key="wrong").status_code == 401
    assert httpx.get(f"{server.base}/v1/models").status_code == 401
    assert httpx.get(f"{server.base}/health").status_code == 200   # not under /v1
    bad = _post(server, "/v1/chat/completions", b"{not json")
    assert bad.status_code == 400 and "not valid JSON" in _error(bad)["message"]
    odd = _post(server, "/v1/chat/completions", {"messages": [{"role": "user",
                                                               "content": 5}]})
    assert odd.status_code == 400 and _error(odd)["param"] == "messages"


def test_queue_full_is_503_with_retry_after(server, client):
    async def flood():
        async with httpx.AsyncClient(timeout=60) as http:
            # As long as the context allows: the first ten still hold the 4 running slots
            # and the 6 queued ones when the last of the 24 arrives, on a far faster engine.
            body = {"model": MODEL, "prompt": "flood", "max_tokens": 1000, "ignore_eos": True}
            return await asyncio.gather(*(http.post(
                f"{server.base}/v1/completions", json=body,
                headers={"Authorization": f"Bearer {KEY}"}) for _ in range(24)))

    responses = asyncio.run(flood())
    codes = [r.status_code for r in responses]
    # At least the first request and a full queue behind it are accepted; the rest refused.
    assert codes.count(200) >= 7 and 503 in codes
    refused = next(r for r in responses if r.status_code == 503)
    assert refused.headers["retry-after"] and _error(refused)["code"] == "queue_full"
    assert all(len(r.json()["choices"][0]["text"]) > 0 for r in responses
               if r.status_code == 200)
    stats = _idle(server)
    assert stats["kv_blocks_free"] == stats["kv_blocks_total"]


def test_disconnect_mid_stream_frees_blocks(server):
    body = {"model": MODEL, "prompt": "go on", "max_tokens": 800, "ignore_eos": True,
            "stream": True}
    with httpx.stream("POST", f"{server.base}/v1/completions", json=body,
                      headers={"Authorization": f"Bearer {KEY}"}, timeout=30) as response:
        for line in response.iter_lines():
            if line.startswith("data: {"):
                break
    stats = _idle(server)   # the connection is closed: the request is aborted
    assert stats["num_running"] == 0
    assert stats["kv_blocks_free"] == stats["kv_blocks_total"]


def test_metrics_follow_the_api_key(server):
    """With --api-key, /metrics needs the key too (no --metrics-public here)."""
    assert httpx.get(f"{server.base}/metrics").status_code == 401
    wrong = httpx.get(f"{server.base}/metrics", headers={"Authorization": "Bearer nope"})
    assert wrong.status_code == 401
    assert wrong.json()["error"]["code"] == "invalid_api_key"
    right = httpx.get(f"{server.base}/metrics", headers={"Authorization": f"Bearer {KEY}"})
    assert right.status_code == 200 and "folio:num_requests_running" in right.text


def test_metrics_public_serves_them_without_the_key():
    from fastapi.testclient import TestClient

    from folio.frontend.http.server import create_app

    class Engine:   # what the routes used here read
        observers: list = []
        max_model_len = 64
        tokenizer = None   # create_app reads whether its chat template renders tools

        async def stats(self, timeout: float = 1.0) -> dict:
            return {"num_running": 3}

    answers = {}
    for public in (True, False):
        with TestClient(create_app(Engine(), MODEL, api_key=KEY,
                                   metrics_public=public)) as http:
            answers[public] = http.get("/metrics")
            assert http.get("/v1/models").status_code == 401   # the API stays guarded
    assert answers[True].status_code == 200
    assert "folio:num_requests_running 3.0" in answers[True].text
    assert answers[False].status_code == 401


def test_metrics_move(server, client):
    def scrape() -> dict:
        text = httpx.get(f"{server.base}/metrics",
                         headers={"Authorization": f"Bearer {KEY}"}).text
        values = {}
        for family in text_string_to_metric_families(text):
            for sample in family.samples:
                key = sample.name + "".join(f"|{k}={v}" for k, v in sorted(
                    sample.labels.items()) if k != "model_name")
                values[key] = sample.value
        return values

    before = scrape()
    client.completions.create(model=MODEL, prompt="count me", max_tokens=3, temperature=0)
    after = scrape()
    assert after["folio:generation_tokens_total"] - before.get(
        "folio:generation_tokens_total", 0) == 3
    assert after["folio:request_success_total|finished_reason=length"] > before.get(
        "folio:request_success_total|finished_reason=length", 0)
    assert after["folio:prompt_tokens_total"] > before.get("folio:prompt_tokens_total", 0)
    assert after["folio:time_to_first_token_seconds_count"] > before.get(
        "folio:time_to_first_token_seconds_count", 0)
    assert after["folio:request_queue_time_seconds_count"] > before.get(
        "folio:request_queue_time_seconds_count", 0)
    for name in ("folio:num_requests_running", "folio:num_requests_waiting",
                 "folio:kv_cache_usage_perc", "folio:prefix_cache_queries_total",
                 "folio:num_preemptions_total|mode=recompute",
                 "folio:e2e_request_latency_seconds_count",
                 "folio:inter_token_latency_seconds_count"):
        assert name in after
    # The weights' read rate of decode steps (scheduler/decode_rate.py): 2 of the 3 tokens
    # came from decode-only steps. Stats may be up to 0.1 s old: scrape until they show.
    while scrape()["folio:decode_steps_total"] < before.get("folio:decode_steps_total", 0) + 2:
        pass
    after = scrape()
    assert after["folio:weight_bytes_per_step"] > 0
    assert after["folio:decode_forward_seconds_total"] > before.get(
        "folio:decode_forward_seconds_total", 0)
    assert after["folio:decode_weight_read_gbps"] > 0


def test_dead_engine_is_503(tmp_path, llama_dir):
    port = free_port()
    proc = subprocess.Popen([sys.executable, "-m", "folio", "frontend", "--model",
                             str(llama_dir), "--client-address", f"ipc://{tmp_path}/c.sock",
                             "--scheduler-address", f"ipc://{tmp_path}/nobody.sock",
                             "--port", str(port)], cwd=ROOT,
                            env={**__import__("os").environ, "PYTHONPATH": str(ROOT)})
    try:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            try:
                health = httpx.get(f"http://127.0.0.1:{port}/health", timeout=1)
                break
            except httpx.HTTPError:
                time.sleep(0.1)
        assert health.status_code == 503 and health.headers["retry-after"]
        response = httpx.post(f"http://127.0.0.1:{port}/v1/completions",
                              json={"prompt": "x"}, timeout=10)
        assert response.status_code == 503 and response.headers["retry-after"]
        assert "scheduler is not reachable" in _error(response)["message"]
    finally:
        proc.terminate()
        proc.wait(timeout=20)


def test_deadline_and_never_fitting_requests(server):
    # 20 ms for 1000 tokens: past the deadline on a far faster engine too.
    late = _post(server, "/v1/completions", {"model": MODEL, "prompt": "slow",
                                             "max_tokens": 1000, "ignore_eos": True,
                                             "deadline": 0.02})
    assert late.status_code == 408 and _error(late)["code"] == "request_timeout"
    bad = _post(server, "/v1/completions", {"model": MODEL, "prompt": "x", "deadline": -1})
    assert bad.status_code == 400 and _error(bad)["param"] == "deadline"
    huge = _post(server, "/v1/completions", {"model": MODEL, "prompt": "x", "max_tokens": 5000})
    assert huge.status_code == 400 and "max_model_len = 1024" in _error(huge)["message"]
    stats = _idle(server)
    assert stats["kv_blocks_free"] == stats["kv_blocks_total"]


def _generated(server) -> float:
    """folio:generation_tokens_total: every token the engine made for this frontend."""
    text = httpx.get(f"{server.base}/metrics", headers={"Authorization": f"Bearer {KEY}"},
                     timeout=30).text
    return sum(float(line.rpartition(" ")[2]) for line in text.splitlines()
               if line.startswith("folio:generation_tokens_total"))


def test_stop_string_frees_each_sample_of_n(client, server):
    plain = client.completions.create(model=MODEL, prompt="The while", max_tokens=16,
                                      temperature=0).choices[0].text
    stop = plain[3:6]
    generated = _generated(server)
    response = client.completions.create(model=MODEL, prompt="The while", max_tokens=900,
                                         temperature=0, n=2, stop=[stop],
                                         extra_body={"ignore_eos": True})
    assert [c.finish_reason for c in response.choices] == ["stop", "stop"]
    assert all(c.text == plain[:plain.index(stop)] for c in response.choices)
    stats = _idle(server)
    assert stats["num_running"] == 0 and stats["kv_blocks_free"] == stats["kv_blocks_total"]
    # Neither sample ran on to 900 tokens (counted, not timed: the tokens the engine made
    # before the stop's abort reached it depend on its speed, and stay far below 900).
    assert _generated(server) - generated < 900, generated
