"""Clients that vanish: their requests are aborted and their KV blocks freed, and the next
request is served promptly."""

from __future__ import annotations

import asyncio
import json
import random
import time
import uuid

import httpx
import pytest
import zmq
import zmq.asyncio
from folio.shared.protocol import messages as m
from folio import SamplingParams
from folio.client import AsyncClient, Client
from folio.errors import FolioError
from tests.processes.cluster import (GREEDY, NUM_KV_BLOCKS, PROBE_PROMPT, queue_kept_full,
                                     random_prompt)

pytestmark = pytest.mark.slow


def test_200_vanishing_clients_then_a_normal_request_promptly(healthy):
    rng = random.Random(2)
    kinds = ["raw"] * 70 + ["sdk"] * 60 + ["http"] * 70
    rng.shuffle(kinds)
    jobs = [(kind, random_prompt(rng, 4, 40), rng.randint(300, 900), rng.uniform(0.05, 1.5))
            for kind in kinds]

    async def raw(prompt, max_tokens, after):
        """A client process that dies mid-stream: its socket closes, no abort is sent."""
        ctx = zmq.asyncio.Context()
        sock = ctx.socket(zmq.DEALER)
        sock.setsockopt(zmq.LINGER, 0)
        sock.connect(healthy.client_addresses[rng.randrange(2)])
        await sock.send(m.encode_generate(uuid.uuid4().hex, SamplingParams(
            max_tokens=max_tokens, **GREEDY), True, prompt_token_ids=prompt))
        await asyncio.sleep(after)
        sock.close(0)
        ctx.term()

    async def sdk(prompt, max_tokens, after):
        """An SDK user that stops reading mid-stream and closes its client."""
        async with AsyncClient(healthy.client_addresses[rng.randrange(2)]) as client:
            try:
                async with asyncio.timeout(after):
                    async for _ in client.stream(prompt, SamplingParams(max_tokens=max_tokens,
                                                                        **GREEDY)):
                        pass
            except (TimeoutError, FolioError):
                pass

    async def http(client, prompt, max_tokens, after):
        """An HTTP stream closed early (some before the first token)."""
        body = {"prompt": prompt, "max_tokens": max_tokens, "stream": True, **GREEDY}
        try:
            async with asyncio.timeout(after):
                async with client.stream("POST", "/v1/completions", json=body) as response:
                    async for _ in response.aiter_lines():
                        pass
        except (TimeoutError, httpx.HTTPError):
            pass

    async def run():
        # 50 clients at a time: each one that vanishes makes room for the next (not waves
        # of 50, each waiting for its longest-lived client).
        room = asyncio.Semaphore(50)
        async with httpx.AsyncClient(base_url=healthy.base, timeout=30) as client:

            async def one(job):
                async with room:
                    await (raw(*job[1:]) if job[0] == "raw" else sdk(*job[1:])
                           if job[0] == "sdk" else http(client, *job[1:]))

            await asyncio.gather(*map(one, jobs))

    asyncio.run(asyncio.wait_for(run(), 240))
    started = time.monotonic()
    with Client(healthy.client_addresses[0]) as client:
        result = client.generate(PROBE_PROMPT, SamplingParams(max_tokens=8, **GREEDY),
                                 timeout=120)
    elapsed = time.monotonic() - started
    assert result.token_ids == healthy.reference
    # The bound is the behaviour: the vanished clients' requests are dropped as they leave,
    # so the probe waits behind none of them. Were they left to run, it would queue behind
    # ~40,000 tokens of them on 64 blocks (minutes here); 30 s leaves a loaded machine room.
    assert elapsed < 30, f"the first request after the disconnects took {elapsed:.1f} s"
    healthy.check_alive()
    stats = healthy.wait_idle(timeout=60)
    assert stats["kv_blocks_free"] == stats["kv_blocks_total"] == NUM_KV_BLOCKS, stats


def test_closing_an_async_client_fails_its_pending_calls(healthy):
    """close() while a stream is being read ends that read at once with an error (it must
    not wait for the request timeout), and the server frees the request's blocks."""

    async def run():
        client = AsyncClient(healthy.client_addresses[0], timeout=60)
        await client.__aenter__()

        started = asyncio.Event()

        async def consume():
            async for _ in client.stream([5] * 20, SamplingParams(max_tokens=990, **GREEDY)):
                started.set()

        reader = asyncio.create_task(consume())
        await asyncio.wait_for(started.wait(), 60)   # being read, with ~990 tokens to go
        await client.close()
        done, _ = await asyncio.wait({reader}, timeout=3)
        if not done:
            reader.cancel()
            await asyncio.gather(reader, return_exceptions=True)
            return "still waiting 3 s after close()"
        error = reader.exception()
        return "finished" if error is None else type(error).__name__

    assert asyncio.run(run()) in ("ServerUnreachable", "EngineDead", "FolioError")
    stats = healthy.wait_idle(timeout=60)
    assert stats["kv_blocks_free"] == stats["kv_blocks_total"], stats


def test_an_abandoned_sdk_stream_is_aborted_at_once_and_frees_its_blocks(healthy):
    """break out of a stream, or aclose() it: the request is aborted on the server (its
    blocks come back) while the client is still open and idle."""

    async def run():
        freed = {}
        async with AsyncClient(healthy.client_addresses[0]) as client:
            for how in ("break", "aclose"):
                stream = client.stream([6] * 20, SamplingParams(max_tokens=900, **GREEDY))
                if how == "break":
                    async for _ in stream:
                        break
                    del stream   # what leaving the loop's scope does
                else:
                    await stream.__anext__()
                    await stream.aclose()
                freed[how] = await asyncio.to_thread(healthy.wait_idle, 0, 10.0)
        return freed

    for how, stats in asyncio.run(run()).items():
        assert stats["num_running"] == stats["num_waiting"] == 0, (how, stats)
        assert stats["kv_blocks_free"] == stats["kv_blocks_total"], (how, stats)


def test_an_http_client_that_leaves_before_its_answer_frees_its_blocks(healthy):
    """A non-streamed request whose client disconnects while it runs is aborted."""

    async def run():
        async with httpx.AsyncClient(base_url=healthy.base, timeout=30) as http:
            post = asyncio.create_task(http.post("/v1/completions", json={
                "prompt": [4] * 20, "max_tokens": 900, **GREEDY}))
            deadline = time.monotonic() + 20
            while (await asyncio.to_thread(healthy.stats))["num_running"] == 0:
                assert time.monotonic() < deadline, "the request never ran"
                await asyncio.sleep(0.05)
            post.cancel()   # closes the connection
            await asyncio.gather(post, return_exceptions=True)
        return await asyncio.to_thread(healthy.wait_idle, 0, 10.0)

    stats = asyncio.run(run())
    assert stats["num_running"] == stats["num_waiting"] == 0, stats
    assert stats["kv_blocks_free"] == stats["kv_blocks_total"], stats


def test_a_multi_prompt_request_with_a_refused_prompt_leaves_no_prompt_running(healthy):
    """While a flood keeps the queue full, completions of 8 prompts (streamed or not) are
    refused in part: whatever the client gets (a 503, or an error event after the first
    bytes), none of their prompts keeps running once the flood is gone."""

    async def attempt(http: httpx.AsyncClient, stream: bool) -> str:
        body = {"prompt": [[20 + i] * 10 for i in range(8)], "max_tokens": 300,
                "deadline": 20, "stream": stream, **GREEDY}
        async with http.stream("POST", "/v1/completions", json=body) as response:
            text = (await response.aread()).decode()
        if response.status_code != 200:
            return f"{response.status_code} {json.loads(text)['error']['code']}"
        errors = [json.loads(line[6:])["error"]["code"] for line in text.splitlines()
                  if line.startswith("data: {") and '"error"' in line]
        return f"200 then {errors[0]}" if errors else "200"

    async def run():
        async with AsyncClient(healthy.client_addresses[1]) as client, \
                httpx.AsyncClient(base_url=healthy.base, timeout=60) as http:
            async with queue_kept_full(client, timeout=120):
                outcomes = [await attempt(http, stream) for stream in (True, False) * 3]
        return outcomes, await asyncio.to_thread(healthy.wait_idle, 0, 20.0)

    outcomes, stats = asyncio.run(run())
    assert any(o.endswith("queue_full") for o in outcomes), outcomes
    assert stats["num_running"] == stats["num_waiting"] == 0, (outcomes, stats)
    assert stats["kv_blocks_free"] == stats["kv_blocks_total"], (outcomes, stats)


