"""Overload: a flood of requests completes right or is refused (queue full), never lost; bursts
of client messages and large generates fail no running request."""

from __future__ import annotations

import asyncio
import json
import random
import subprocess
import sys

import httpx
import pytest
import zmq
import zmq.asyncio

from folio import SamplingParams
from folio.client import AsyncClient, Client, Completion
from folio.errors import FolioError, QueueFull
from folio.shared.protocol import messages as m
from tests.pipeline import start_streams
from tests.processes.cluster import (ENDLESS, GREEDY, MAX_QUEUED, NUM_KV_BLOCKS, PROBE_PROMPT,
                                     Cluster, queue_kept_full, random_prompt, value_or_error)
from tests.processes.test_zeromq_fuzz import fuzz_messages

pytestmark = pytest.mark.slow


def test_1000_concurrent_requests_complete_right_or_are_refused_queue_full(healthy):
    rng = random.Random(1)
    count = 1000
    prompts = [random_prompt(rng, 1, 40) for _ in range(count)]
    max_tokens = [rng.randint(1, 6) for _ in range(count)]

    async def flood():
        clients = [AsyncClient(healthy.client_addresses[i % 2]) for i in range(4)]
        for client in clients:
            await client.__aenter__()

        async def one(i):
            try:
                return await clients[i % 4].generate(
                    prompts[i], SamplingParams(max_tokens=max_tokens[i], **GREEDY), timeout=60)
            except FolioError as error:
                return error

        try:
            return await asyncio.wait_for(asyncio.gather(*(one(i) for i in range(count))), 240)
        finally:
            for client in clients:
                await client.close()

    results = asyncio.run(flood())
    completed = [i for i, r in enumerate(results) if isinstance(r, Completion)]
    refused = [i for i, r in enumerate(results) if isinstance(r, QueueFull)]
    others = [(i, type(r).__name__, str(r)[:200]) for i, r in enumerate(results)
              if i not in set(completed) | set(refused)]
    assert not others, others[:5]
    assert len(completed) >= MAX_QUEUED and refused, (len(completed), len(refused))
    assert all("queue is full" in str(results[i]) for i in refused)
    for i in completed:
        assert results[i].finish_reason == "length"
        assert len(results[i].token_ids) == max_tokens[i]
    healthy.check_alive()
    with Client(healthy.client_addresses[0]) as client:
        for i in rng.sample(completed, 12):   # the same tokens as the prompt alone gets
            solo = client.generate(prompts[i], SamplingParams(max_tokens=max_tokens[i],
                                                              **GREEDY))
            assert solo.token_ids == results[i].token_ids, i
    stats = healthy.wait_idle()
    assert stats["kv_blocks_free"] == stats["kv_blocks_total"] == NUM_KV_BLOCKS, stats


def test_streamed_http_requests_refused_by_a_full_queue_get_503(healthy):
    """Queue full is HTTP 503 with Retry-After for streamed requests too, not a 200 whose
    stream then carries the refusal. A flood through the SDK keeps the queue full."""

    async def stream_status(http: httpx.AsyncClient) -> str:
        body = {"prompt": [3] * 10, "max_tokens": 4, "stream": True}
        async with http.stream("POST", "/v1/completions", json=body) as response:
            if response.status_code != 200:
                await response.aread()
                error = response.json()["error"]
                retry = "with" if response.headers.get("retry-after") else "without"
                return f"{response.status_code} {error['code']} {retry} Retry-After"
            async for line in response.aiter_lines():
                if line.startswith("data: {") and '"error"' in line:
                    return f"200 then an error event {json.loads(line[6:])['error']['code']}"
        return "200"

    async def run():
        async with AsyncClient(healthy.client_addresses[1]) as client, \
                queue_kept_full(client, timeout=60), \
                httpx.AsyncClient(base_url=healthy.base, timeout=30) as http:
            return await asyncio.gather(*(stream_status(http) for _ in range(20)))

    outcomes = asyncio.run(run())
    refused = [o for o in outcomes if o != "200"]
    assert refused, "no streamed request was refused while the queue was full"
    assert set(refused) == {"503 queue_full with Retry-After"}, outcomes
    stats = healthy.wait_idle()
    assert stats["kv_blocks_free"] == stats["kv_blocks_total"], stats


BURST_WAIT_S = 150   # generous: a loaded 2-core machine is slow, and slow is not dead


def _burst(healthy: "Cluster"):
    """While the frontend works through a burst of client messages (10,000 fuzzed ones and
    20 of the largest legal size, 2**22 prompt ids, each refused as too long), a request
    running meanwhile and one sent meanwhile: what each ended with. The running one is an
    ENDLESS stream that has streamed a token before the burst: it still runs when the
    burst is done at any engine speed, and is aborted at the end ("running" when it was
    still streaming then, unfailed)."""

    async def run():
        async with AsyncClient(healthy.client_addresses[0]) as client:
            (job,) = await start_streams(client, [3] * 20, SamplingParams(
                max_tokens=ENDLESS, **GREEDY), timeout=BURST_WAIT_S)
            ctx = zmq.Context()
            sock = ctx.socket(zmq.DEALER)
            try:
                sock.setsockopt(zmq.LINGER, 0)
                sock.setsockopt(zmq.SNDHWM, 0)
                sock.connect(healthy.client_addresses[0])
                for frames in fuzz_messages("frontend-clients", 10_000, seed=5):
                    sock.send_multipart(frames)
                for i in range(20):
                    sock.send(m.pack("generate", {"id": f"big-{i}", "params": {},
                                                  "prompt_token_ids": [1] * 2**22}))
                # The frontend's first answer to the burst: it is working through it now.
                assert await asyncio.to_thread(sock.poll, BURST_WAIT_S * 1000), \
                    "no answer to the burst"
                during = await value_or_error(client.generate(
                    PROBE_PROMPT, SamplingParams(max_tokens=8, **GREEDY), timeout=BURST_WAIT_S))
            finally:
                sock.close()
                ctx.term()
            if not job.done():   # still streaming, nothing failed it: end it (an abort)
                job.cancel()
                await asyncio.gather(job, return_exceptions=True)
                return "running", during
            return await value_or_error(job), during

    return asyncio.run(run())


def _assert_burst_harmless(healthy: "Cluster", running, during) -> None:
    """Both unharmed: no 'the scheduler is not reachable' while it was busy."""
    assert not isinstance(running, FolioError), f"the running request failed: {running!r}"
    assert not isinstance(during, FolioError), f"the request sent meanwhile failed: {during!r}"
    if running != "running":   # an engine fast enough to finish it: it finished normally
        assert running.finish_reason == "length" and len(running.token_ids) == ENDLESS
    assert during.token_ids == healthy.reference
    stats = healthy.wait_idle(timeout=60)   # the aborted stream's blocks come back
    assert stats["kv_blocks_free"] == stats["kv_blocks_total"], stats


def test_a_burst_of_client_messages_does_not_fail_running_requests(long_cluster):
    _assert_burst_harmless(long_cluster, *_burst(long_cluster))


def test_the_burst_beside_two_cpu_bound_processes_fails_nothing(long_cluster):
    """The same on a machine that is busy with something else: two processes spinning."""
    spinners = [subprocess.Popen([sys.executable, "-c", "while True: pass"])
                for _ in range(2)]
    try:
        running, during = _burst(long_cluster)
    finally:
        for proc in spinners:
            proc.kill()
            proc.wait(timeout=10)
    _assert_burst_harmless(long_cluster, running, during)
    long_cluster.assert_serving(0)
    long_cluster.assert_serving(1)


def test_an_abort_that_overtakes_a_large_generate_being_prepared_is_applied(healthy):
    """A generate over 16 KiB is prepared in the pool; an abort sent right after it arrives
    first: the request ends as aborted, never runs, and nothing is left allocated."""
    ctx = zmq.Context()
    sock = ctx.socket(zmq.DEALER)
    try:
        sock.setsockopt(zmq.LINGER, 0)
        sock.connect(healthy.client_addresses[0])
        generate = m.pack("generate", {
            "id": "overtaken", "params": SamplingParams(max_tokens=900, **GREEDY).to_dict(),
            "prompt_token_ids": [5] * 20, "stream": False,
            "padding": [0] * 2**22})   # ignored (an unknown key), but slow to decode
        sock.send(generate)
        sock.send(m.pack("abort", {"id": "overtaken"}))
        assert sock.poll(30_000), "no answer"
        kind, body = m.unpack(sock.recv())
    finally:
        sock.close(0)
        ctx.term()
    assert (kind, body["finish_reason"], body["token_ids"]) == ("final", "abort", []), body
    stats = healthy.wait_idle(timeout=5)
    assert stats["num_running"] == stats["num_waiting"] == 0, stats
    assert stats["kv_blocks_free"] == stats["kv_blocks_total"], stats


def test_a_large_generate_is_answered_by_its_id(healthy):
    """Large generates are decoded in the pool: one too long for the model, and one that is
    malformed, each get an error under their own id."""
    ctx = zmq.Context()
    sock = ctx.socket(zmq.DEALER)
    try:
        sock.setsockopt(zmq.LINGER, 0)
        sock.connect(healthy.client_addresses[0])
        sock.send(m.pack("generate", {"id": "long-one", "params": {}, "stream": False,
                                      "prompt_token_ids": [1] * 2**20}))
        sock.send(m.pack("generate", {"id": "bad-one", "params": {}, "stream": False,
                                      "prompt_token_ids": [1, 2], "prompt": "and a prompt",
                                      "padding": [0] * 2**20}))   # large, so in the pool
        replies = {}
        while len(replies) < 2 and sock.poll(30_000):
            kind, body = m.unpack(sock.recv())
            replies[body["id"]] = (kind, body.get("code"), body.get("message", ""))
    finally:
        sock.close(0)
        ctx.term()
    assert replies["long-one"][:2] == ("error", "invalid"), replies
    assert "1048576 tokens" in replies["long-one"][2] and "max_model_len = 1024" in \
        replies["long-one"][2]
    assert replies["bad-one"][:2] == ("error", "invalid"), replies
    assert "exactly one of" in replies["bad-one"][2]


