"""The three processes over ZeroMQ, driven through the client SDK."""

from __future__ import annotations

import asyncio
import os
import random
import signal
import time

import pytest

from folio import SamplingParams
from folio.client import AsyncClient, Client
from folio.errors import EngineDead, RequestRejected
from tests.hf_oracle import hf_greedy
from tests.pipeline import Pipeline, start_streams
from tests.processes.test_zeromq_fuzz import send_all

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def pipeline(tmp_path_factory, llama_dir):
    run_dir = tmp_path_factory.mktemp("run")
    pipe = Pipeline(run_dir, llama_dir, num_frontends=2,
                    engine_args=("--num-kv-blocks", "512"))
    try:
        pipe.wait_ready()
        yield pipe
    finally:
        pipe.stop()


def _prompts(count: int, seed: int) -> tuple[list[list[int]], list[int]]:
    rng = random.Random(seed)
    prompts = [[rng.randrange(1, 1024) for _ in range(rng.randint(1, 120))]
               for _ in range(count)]
    return prompts, [rng.randint(1, 24) for _ in range(count)]


def test_32_concurrent_requests_half_streamed_match_transformers(pipeline, llama_dir):
    prompts, max_tokens = _prompts(32, seed=7)
    expected = hf_greedy(llama_dir, prompts, max_tokens)

    async def run():
        async with AsyncClient(pipeline.client_addresses[0]) as client:
            async def one(i):
                params = SamplingParams(temperature=0, max_tokens=max_tokens[i])
                if i % 2:
                    ids = []
                    async for delta in client.stream(prompts[i], params):
                        ids.extend(delta.token_ids)
                    return ids
                return (await client.generate(prompts[i], params)).token_ids
            return await asyncio.wait_for(asyncio.gather(*(one(i) for i in range(32))), 120)

    assert asyncio.run(run()) == expected


def test_text_prompt_chat_and_usage(pipeline, tokenizer_dir):
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(str(tokenizer_dir))
    with Client(pipeline.client_addresses[0]) as client:
        result = client.generate("The for statement", SamplingParams(temperature=0,
                                                                     max_tokens=12))
        assert result.usage.prompt_tokens == len(tokenizer.encode("The for statement"))
        assert result.usage.completion_tokens == len(result.token_ids) == 12
        assert result.text == tokenizer.decode(result.token_ids, skip_special_tokens=True)
        streamed = "".join(d.text for d in client.stream("The for statement",
                                                         SamplingParams(temperature=0,
                                                                        max_tokens=12)))
        assert streamed == result.text
        chat = client.chat([{"role": "user", "content": "hello"}],
                           SamplingParams(temperature=0, max_tokens=5))
        templated = tokenizer.apply_chat_template([{"role": "user", "content": "hello"}],
                                                  add_generation_prompt=True, tokenize=True)
        if hasattr(templated, "keys"):
            templated = templated["input_ids"]
        assert chat.usage.prompt_tokens == len(templated)


def test_rejected_requests_raise_typed_errors(pipeline):
    with Client(pipeline.client_addresses[0]) as client:
        with pytest.raises(RequestRejected, match="max_model_len = 1024"):
            client.generate([5] * 1025)
        # A request that could never finish is refused up front, not cut short later.
        with pytest.raises(RequestRejected, match=r"plus max_tokens \(30\) is 1030 tokens"):
            client.generate([5] * 1000, SamplingParams(max_tokens=30))
        with pytest.raises(RequestRejected, match="temperature must be >= 0"):
            client._call(client._async._complete(
                {"prompt": "x"}, _RawParams({"temperature": -1.0}), None, None))
        assert client.health()["stats"]["kv_blocks_free"] == 512


class _RawParams:
    """Params that skip client-side validation, to prove the server checks too."""

    def __init__(self, raw):
        self.raw = raw

    def to_dict(self):
        return {**SamplingParams().to_dict(), **self.raw}


def test_abort_mid_stream_frees_blocks(pipeline):
    with Client(pipeline.client_addresses[0]) as client:
        stream = client.stream([9] * 200, SamplingParams(max_tokens=800, ignore_eos=True),
                               request_id="abort-me")
        got = 0
        for delta in stream:
            got += len(delta.token_ids)
            if got >= 3:
                break
        stream.close()   # leaving the stream aborts the request
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            stats = client.health()["stats"]
            if stats["kv_blocks_free"] == stats["kv_blocks_total"] and stats["num_running"] == 0:
                break
            time.sleep(0.05)
        assert stats["kv_blocks_free"] == stats["kv_blocks_total"] == 512


def test_explicit_abort_finishes_with_abort(pipeline):
    async def run():
        async with AsyncClient(pipeline.client_addresses[0]) as client:
            (task,) = await start_streams(client, [3] * 50, SamplingParams(
                max_tokens=970, ignore_eos=True), request_ids=["cut"])
            await client.abort("cut")   # it has streamed a token: it runs
            return await asyncio.wait_for(task, 60)

    result = asyncio.run(run())
    assert result.finish_reason == "abort" and len(result.token_ids) < 970


def test_two_frontends_get_only_their_own_outputs(pipeline):
    prompts, max_tokens = _prompts(8, seed=11)

    async def run(address, offset):
        async with AsyncClient(address) as client:
            jobs = [client.generate(prompts[i], SamplingParams(temperature=0,
                                                               max_tokens=max_tokens[i]),
                                    request_id=f"same-id-{i}")
                    for i in range(offset, 8, 2)]
            return await asyncio.gather(*jobs)

    async def both():
        return await asyncio.gather(run(pipeline.client_addresses[0], 0),
                                    run(pipeline.client_addresses[1], 1))

    first, second = asyncio.run(both())
    with Client(pipeline.client_addresses[0]) as client:
        solo = [client.generate(prompts[i], SamplingParams(temperature=0,
                                                           max_tokens=max_tokens[i])).token_ids
                for i in range(8)]
        assert client.health()["stats"]["num_frontends"] == 2
    assert [r.token_ids for r in first] == solo[0::2]
    assert [r.token_ids for r in second] == solo[1::2]


def test_garbage_on_every_socket_leaves_processes_serving(pipeline):
    import msgpack

    from folio.shared.protocol.wire import PROTOCOL_VERSION

    rng = random.Random(3)
    payloads = [b"", b"\x00", b"\xff" * 100, msgpack.packb([PROTOCOL_VERSION]),
                msgpack.packb([99, "add", {}]), msgpack.packb([PROTOCOL_VERSION, "nope", {}]),
                msgpack.packb([PROTOCOL_VERSION, "add", {"id": 5, "prompt": "x"}]),
                msgpack.packb([PROTOCOL_VERSION, "plan", {"s": -1}]),
                msgpack.packb([PROTOCOL_VERSION, "result", {"s": 0, "h": [1], "t": []}]),
                msgpack.packb([PROTOCOL_VERSION, "generate", {"id": "x", "prompt": "hi",
                                                              "params": {"n": "many"}}]),
                msgpack.packb([PROTOCOL_VERSION, "executor_hello", {"num_kv_blocks": 0}]),
                msgpack.packb({"a": 1})[:-1]]
    payloads += [bytes(rng.randrange(256) for _ in range(rng.randint(1, 64)))
                 for _ in range(40)]
    for address in [pipeline.frontend_address, pipeline.executor_address,
                    *pipeline.client_addresses]:
        send_all(address, [frames for payload in payloads
                           for frames in ([payload], [payload, payload])])
    time.sleep(0.5)   # a process the garbage kills has died by now
    pipeline.check_alive()
    with Client(pipeline.client_addresses[1]) as client:
        result = client.generate([1, 2, 3], SamplingParams(temperature=0, max_tokens=4))
        assert len(result.token_ids) == 4
        assert client.health()["ok"]


def test_killing_the_executor_fails_in_flight_requests_then_recovers(pipeline):
    async def run():
        async with AsyncClient(pipeline.client_addresses[0]) as client:
            # Each has streamed a token and has ~1000 to go when the executor dies.
            jobs = await start_streams(client, [7] * 20, SamplingParams(
                max_tokens=1000, ignore_eos=True), count=4)
            os.kill(pipeline.procs["executor"].pid, signal.SIGKILL)
            killed = time.monotonic()
            results = await asyncio.wait_for(
                asyncio.gather(*jobs, return_exceptions=True), 60)
            return results, time.monotonic() - killed

    try:
        results, _ = asyncio.run(run())
        assert all(isinstance(r, EngineDead) for r in results), results
        # The broken connection is noticed at once, not at the heartbeat timeout: the
        # reason names how it was noticed (no clock, which a loaded machine stretches).
        assert "executor's connection closed" in str(results[0]), results[0]
        pipeline.procs["executor"].wait()
        with Client(pipeline.client_addresses[0]) as client:
            assert not client.health()["ok"]
            with pytest.raises(EngineDead):
                client.generate([1, 2], SamplingParams(max_tokens=2))
    finally:
        pipeline.restore_executor()   # the tests after this one share it
    with Client(pipeline.client_addresses[0]) as client:
        assert len(client.generate([1, 2], SamplingParams(max_tokens=3)).token_ids) == 3
        stats = client.health()["stats"]
        assert stats["kv_blocks_free"] == stats["kv_blocks_total"]


def test_stopped_executor_fails_requests_and_resumes_after_sigcont(pipeline):
    executor = pipeline.procs["executor"]

    async def run():
        async with AsyncClient(pipeline.client_addresses[1]) as client:
            (job,) = await start_streams(client, [4] * 30, SamplingParams(
                max_tokens=990, ignore_eos=True))
            os.kill(executor.pid, signal.SIGSTOP)   # it runs, with ~990 tokens to go
            stopped = time.monotonic()
            try:
                await asyncio.wait_for(job, 60)
            except EngineDead as error:
                return str(error), time.monotonic() - stopped
            return "no error", 0.0

    try:
        message, elapsed = asyncio.run(run())
    finally:
        os.kill(executor.pid, signal.SIGCONT)
        if executor.poll() is not None:   # never leave the shared fixture without one
            pipeline.restore_executor()
    assert "stopped responding" in message or "connection closed" in message, message
    # The bound is the behaviour: a stopped executor is given up at its heartbeat timeout
    # (2 s), not never. Generous, as a loaded machine delays every process; a hang would
    # not end before the 60 s wait above.
    assert elapsed < 30, elapsed
    pipeline.wait_ready(timeout=30)   # the same executor process says hello again
    with Client(pipeline.client_addresses[1]) as client:
        assert len(client.generate([1, 2], SamplingParams(max_tokens=3)).token_ids) == 3
        stats = client.health()["stats"]
        assert stats["kv_blocks_free"] == stats["kv_blocks_total"]


def test_stop_strings_and_logprobs_over_the_sdk(pipeline):
    with Client(pipeline.client_addresses[0]) as client:
        plain = client.generate("The for statement", SamplingParams(temperature=0,
                                                                    max_tokens=16))
        stop = plain.text[5:8]
        cut = plain.text.index(stop)
        stopped = client.generate("The for statement", SamplingParams(
            temperature=0, max_tokens=16, stop=[stop], logprobs=2))
        assert stopped.text == plain.text[:cut]
        assert stopped.finish_reason == "stop" and stopped.stop_reason == stop
        assert len(stopped.logprobs) == len(stopped.token_ids)
        assert all(t in entry and len(entry) >= 2
                   for t, entry in zip(stopped.token_ids, stopped.logprobs))
        streamed = "".join(d.text for d in client.stream("The for statement", SamplingParams(
            temperature=0, max_tokens=16, stop=[stop])))
        assert streamed == plain.text[:cut]
        scored = client.generate([5, 6, 7, 8], SamplingParams(max_tokens=1, prompt_logprobs=1))
        assert scored.prompt_logprobs[0] is None and len(scored.prompt_logprobs) == 4
        assert all(t in entry for t, entry in zip([6, 7, 8], scored.prompt_logprobs[1:]))
        with pytest.raises(RequestRejected, match="logit_bias has token id 99999"):
            client.generate("x", SamplingParams(logit_bias={99999: 1.0}))
        deadline = time.monotonic() + 60
        while client.health()["stats"]["num_running"] and time.monotonic() < deadline:
            time.sleep(0.05)
        stats = client.health()["stats"]
        assert stats["kv_blocks_free"] == stats["kv_blocks_total"]


def test_server_deadline_aborts_and_frees_blocks(pipeline):
    from folio.errors import RequestTimeout

    with Client(pipeline.client_addresses[0]) as client:
        # 1000 tokens outlast a 20 ms deadline even on an engine far faster than this one.
        started = time.monotonic()
        with pytest.raises(RequestTimeout, match="deadline of 0.02 s"):
            client.generate([6] * 10, SamplingParams(max_tokens=1000, ignore_eos=True),
                            deadline=0.02, timeout=120)
        assert time.monotonic() - started < 60   # the deadline ended it, not the timeout
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            stats = client.health()["stats"]
            if stats["num_running"] == 0:
                break
            time.sleep(0.05)
        assert stats["kv_blocks_free"] == stats["kv_blocks_total"]
        # A deadline that is not reached changes nothing.
        assert len(client.generate([6] * 10, SamplingParams(max_tokens=4),
                                   deadline=30).token_ids) == 4
