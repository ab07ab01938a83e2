"""Faults: each process killed or stopped while requests surely run; those requests fail with a
clear error, every block comes back and service resumes."""

from __future__ import annotations

import asyncio
import json
import signal
import time

import httpx
import pytest

from folio import SamplingParams
from folio.client import AsyncClient
from folio.errors import EngineDead, ServerUnreachable
from tests.processes.cluster import (ENDLESS, GREEDY, LONG, PROBE_PROMPT, Cluster, sdk_stream,
                                     value_or_error, wait_http_health)

pytestmark = pytest.mark.slow

# Each fault hits requests that are surely running: an SDK stream and an HTTP stream that have
# produced tokens, and a plain HTTP request sent with them, each of 300 tokens (about 20 blocks
# each, so the three fit the 64-block pool together without preemption).


async def _http_stream(http: httpx.AsyncClient, started: asyncio.Event, max_tokens: int = LONG
                       ) -> tuple[int, list[dict]]:
    """A long streamed completion: its status and events; sets `started` at the first."""
    events = []
    body = {"prompt": [9] * 20, "max_tokens": max_tokens, "stream": True, **GREEDY}
    async with http.stream("POST", "/v1/completions", json=body) as response:
        if response.status_code != 200:
            await response.aread()
            started.set()
            return response.status_code, [response.json()]
        async for line in response.aiter_lines():
            if line.startswith("data: {"):
                events.append(json.loads(line[6:]))
                started.set()
    return 200, events


async def _in_flight(http: httpx.AsyncClient, client: AsyncClient, max_tokens: int = LONG
                     ) -> dict[str, asyncio.Task]:
    sdk_started, http_started = asyncio.Event(), asyncio.Event()
    jobs = {"sdk": asyncio.create_task(sdk_stream(client, sdk_started, max_tokens)),
            "stream": asyncio.create_task(_http_stream(http, http_started, max_tokens)),
            "plain": asyncio.create_task(http.post("/v1/completions", json={
                "prompt": [8] * 20, "max_tokens": max_tokens, **GREEDY}))}
    await asyncio.wait_for(asyncio.gather(sdk_started.wait(), http_started.wait()), 60)
    assert not any(job.done() for job in jobs.values()), "a request ended before the fault"
    return jobs


async def _outcomes(jobs: dict[str, asyncio.Task], timeout: float = 10.0) -> dict:
    """What each request ended with: an exception, or its result."""
    done, pending = await asyncio.wait(set(jobs.values()), timeout=timeout)
    for job in pending:
        job.cancel()
    await asyncio.gather(*pending, return_exceptions=True)
    result = {}
    for name, job in jobs.items():
        if job in pending:
            result[name] = f"no answer within {timeout:g} s"
        elif job.exception() is not None:
            result[name] = job.exception()
        else:
            result[name] = job.result()
    return result


def _assert_clear_errors(outcome: dict, sdk_error=EngineDead, words: str = "") -> None:
    """The SDK stream raised `sdk_error`; the HTTP stream ended with an error event; the plain
    HTTP request got a 503, both with the code engine_unavailable."""
    sdk = outcome["sdk"]
    assert isinstance(sdk, sdk_error) and words in str(sdk), f"SDK stream: {sdk!r}"
    stream = outcome["stream"]
    assert isinstance(stream, tuple), f"HTTP stream: {stream!r}"
    status, events = stream
    last = events[-1] if events else {}
    assert status == 200 and "error" in last, (
        f"HTTP stream: {len(events)} events, the last {json.dumps(last)[:300]}")
    assert last["error"]["code"] == "engine_unavailable", last
    plain = outcome["plain"]
    assert isinstance(plain, httpx.Response), f"plain HTTP request: {plain!r}"
    assert plain.status_code == 503, plain.text[:300]
    assert plain.json()["error"]["code"] == "engine_unavailable", plain.text[:300]


def _recovered(cluster: Cluster) -> None:
    cluster.wait_ready(timeout=30)
    assert wait_http_health(cluster.base, 200, 15) == 200
    cluster.assert_serving(0)
    cluster.assert_serving(1)


def test_executor_killed_mid_step_sdk_and_http_fail_then_service_resumes(healthy):
    async def run():
        async with AsyncClient(healthy.client_addresses[0]) as client, \
                httpx.AsyncClient(base_url=healthy.base, timeout=30) as http:
            jobs = await _in_flight(http, client)
            healthy.signal("executor", signal.SIGKILL)
            outcome = await _outcomes(jobs)
            during = await http.post("/v1/completions", json={"prompt": "x", "max_tokens": 2})
            health = (await http.get("/health")).status_code
            return outcome, during, health

    outcome, during, health = asyncio.run(run())
    _assert_clear_errors(outcome, EngineDead, "executor")
    assert during.status_code == 503 and health == 503
    assert healthy.stats(1).get("executor_alive") is False
    healthy.start("executor")
    _recovered(healthy)


def test_scheduler_killed_fails_requests_and_everyone_reconnects_to_a_new_one(healthy):
    survivors = {name: healthy.procs[name].pid for name in ("executor", "frontend0",
                                                              "frontend1")}

    async def run():
        async with AsyncClient(healthy.client_addresses[0]) as client, \
                httpx.AsyncClient(base_url=healthy.base, timeout=30) as http:
            jobs = await _in_flight(http, client)
            healthy.signal("scheduler", signal.SIGKILL)
            outcome = await _outcomes(jobs)
            during = await http.post("/v1/completions", json={"prompt": "x", "max_tokens": 2})
            sdk_during = await value_or_error(
                client.generate([1, 2], SamplingParams(max_tokens=2), timeout=10))
            return outcome, during, sdk_during

    outcome, during, sdk_during = asyncio.run(run())
    _assert_clear_errors(outcome, EngineDead, "scheduler")
    assert during.status_code == 503 and "scheduler" in during.json()["error"]["message"]
    assert isinstance(sdk_during, EngineDead) and "scheduler" in str(sdk_during)
    healthy.start("scheduler")   # the executor and both frontends must find it on their own
    _recovered(healthy)
    assert {name: healthy.procs[name].pid for name in survivors} == survivors
    assert healthy.stats(0)["num_frontends"] == 2


def test_frontend_killed_its_clients_see_errors_its_blocks_come_back(healthy):
    async def run():
        client = AsyncClient(healthy.client_addresses[1], connect_timeout=1.0)
        await client.__aenter__()
        try:
            started = asyncio.Event()
            job = asyncio.create_task(sdk_stream(client, started))
            await asyncio.wait_for(started.wait(), 20)
            healthy.signal("frontend1", signal.SIGKILL)
            pending = (await _outcomes({"sdk": job}))["sdk"]
            later = await value_or_error(
                client.generate([1, 2], SamplingParams(max_tokens=2), timeout=5))
            freed = await asyncio.to_thread(healthy.wait_idle, 0, 5.0)
            healthy.start("frontend1")
            deadline = time.monotonic() + 60
            while True:   # the same client reconnects by itself
                try:
                    again = await client.generate(PROBE_PROMPT, SamplingParams(
                        max_tokens=8, **GREEDY), timeout=10)
                    break
                except (ServerUnreachable, EngineDead):
                    assert time.monotonic() < deadline, "the client never reconnected"
                    await asyncio.sleep(0.1)   # a try waits out its own connect_timeout
            return pending, later, freed, again
        finally:
            await client.close()

    pending, later, freed, again = asyncio.run(run())
    assert isinstance(pending, EngineDead) and "lost the connection" in str(pending), pending
    assert isinstance(later, ServerUnreachable), later
    assert freed["kv_blocks_free"] == freed["kv_blocks_total"], freed
    assert freed["num_running"] == 0
    assert again.token_ids == healthy.reference
    _recovered(healthy)


def test_stopped_scheduler_fails_requests_then_everyone_resumes_after_sigcont(healthy):
    async def run():
        async with AsyncClient(healthy.client_addresses[0]) as client, \
                httpx.AsyncClient(base_url=healthy.base, timeout=30) as http:
            jobs = await _in_flight(http, client)
            healthy.signal("scheduler", signal.SIGSTOP)
            stopped = time.monotonic()
            try:
                outcome = await _outcomes(jobs)
                during = await http.post("/v1/completions", json={"prompt": "x",
                                                                  "max_tokens": 2})
                await asyncio.sleep(max(0.0, stopped + 3.0 - time.monotonic()))   # 3 s
            finally:
                healthy.signal("scheduler", signal.SIGCONT)
            return outcome, during

    outcome, during = asyncio.run(run())
    _assert_clear_errors(outcome, EngineDead, "scheduler")
    assert during.status_code == 503
    _recovered(healthy)   # the same processes: nothing is restarted


def test_stopped_frontend_its_clients_see_errors_then_it_serves_again(long_cluster):
    # Its requests must still run when the scheduler gives up on it (a second or so after
    # the stop, whatever the engine's speed): ENDLESS answers on a cluster of its own.
    healthy = long_cluster

    async def run():
        async with AsyncClient(healthy.client_addresses[0]) as client, \
                httpx.AsyncClient(base_url=healthy.base, timeout=60) as http:
            jobs = await _in_flight(http, client, ENDLESS)
            healthy.signal("frontend0", signal.SIGSTOP)
            try:
                sdk = (await _outcomes({"sdk": jobs.pop("sdk")}, 60))["sdk"]
                # The scheduler gives up on the stopped frontend and frees its blocks.
                freed = await asyncio.to_thread(healthy.wait_idle, 1, 60.0)
            finally:
                healthy.signal("frontend0", signal.SIGCONT)
            # Its HTTP clients, still connected, get an answer once it runs again.
            outcome = await _outcomes(jobs, 60)
            return {"sdk": sdk, **outcome}, freed

    outcome, freed = asyncio.run(run())
    assert freed["kv_blocks_free"] == freed["kv_blocks_total"], freed
    assert freed["num_running"] == 0
    sdk = outcome["sdk"]
    assert isinstance(sdk, EngineDead) and "lost the connection" in str(sdk), repr(sdk)
    _recovered(healthy)
    # Resumed, it answers its HTTP clients at once. Its link to the scheduler dropped while
    # it was stopped (and what the scheduler had queued on it went with it), so what was in
    # flight ends with a clear error: the stream with an error event, not `slow_reader` for
    # the burst of events that waited in its socket; the plain request with a 503.
    stream, plain = outcome["stream"], outcome["plain"]
    assert isinstance(stream, tuple) and stream[0] == 200, f"HTTP stream: {stream!r}"[:300]
    last = stream[1][-1] if stream[1] else {}
    assert last.get("error", {}).get("code") == "engine_unavailable", last
    assert "scheduler" in last["error"]["message"], last
    assert isinstance(plain, httpx.Response), f"plain HTTP request: {plain!r}"
    assert plain.status_code == 503, plain.text[:300]
    assert plain.json()["error"]["code"] == "engine_unavailable", plain.text[:300]
