"""Bounded mixed load on a running `folio serve`, through the SDK (`folio.AsyncClient`) or the
OpenAI HTTP API (streamed `/v1/completions`): prompts and outputs of random lengths, some
requests aborted mid-stream (SDK `abort`, HTTP stream closed early) and some clients that
vanish (a raw ZeroMQ socket closed mid-stream, an HTTP connection dropped before the answer),
at a fixed concurrency.

Each request ends completed, aborted, disconnected, refused (queue full: SDK `QueueFull`, HTTP
503 with code `queue_full`, or a stream that answered 200 and then sent a `queue_full` error
event) or failed. After each round the report says whether the server went idle with every
KV block back (SDK: `health()` stats; HTTP: `/metrics` and `/health`) and the resident memory
of its processes (the pids of `folio serve`'s "pids: ..." line) once idle, and at the end how
much each grew from the first round's idle to the last's.
"""

from __future__ import annotations

import asyncio
import json
import random
import re
import time
import uuid
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import zmq
import zmq.asyncio

from folio import SamplingParams
from folio.client import AsyncClient
from folio.errors import FolioError, QueueFull
from folio.shared.protocol import messages as m
from folio.shared.transport import configure
from tests.soak.memory import rss_mib


@dataclass(frozen=True)
class Mix:
    requests: int = 100                        # per round
    concurrency: int = 16
    prompt_len: tuple[int, int] = (8, 256)     # uniform, in tokens
    output_len: tuple[int, int] = (8, 128)     # max_tokens, uniform
    token_ids: tuple[int, int] = (10, 1000)    # prompt ids drawn from [low, high)
    abort_fraction: float = 0.1
    disconnect_fraction: float = 0.05
    max_vanish_s: float = 1.0                  # a vanishing client leaves within this
    refusal_backoff_s: float = 0.2             # a refused client waits so (Retry-After)
    request_timeout: float = 120.0
    round_timeout: float = 300.0               # then what still runs is given up
    seed: int = 0


@dataclass(frozen=True)
class Job:
    index: int
    prompt: list[int]
    max_tokens: int
    kind: str            # "normal", "abort" or "disconnect"
    cut_after: int       # abort: after this many token chunks
    vanish_s: float      # disconnect: after this many seconds (or the first reply)


@dataclass(frozen=True)
class Outcome:
    status: str          # completed, aborted, disconnected, refused, failed
    error: str | None = None


def make_job(rng: random.Random, index: int, mix: Mix) -> Job:
    prompt = [rng.randrange(*mix.token_ids) for _ in range(rng.randint(*mix.prompt_len))]
    max_tokens = rng.randint(*mix.output_len)
    draw = rng.random()
    kind = ("abort" if draw < mix.abort_fraction else
            "disconnect" if draw < mix.abort_fraction + mix.disconnect_fraction else "normal")
    return Job(index, prompt, max_tokens, kind, cut_after=rng.randint(1, max(1, max_tokens // 2)),
               vanish_s=rng.uniform(0.02, mix.max_vanish_s))


def _greedy(job: Job) -> SamplingParams:
    return SamplingParams(temperature=0.0, max_tokens=job.max_tokens, ignore_eos=True)


class SdkDriver:
    def __init__(self, address: str, mix: Mix, connections: int = 4) -> None:
        self.address = address
        self.clients = [AsyncClient(address, timeout=mix.request_timeout, connect_timeout=10.0)
                        for _ in range(connections)]

    async def close(self) -> None:
        for client in self.clients:
            await client.close()

    async def run(self, job: Job) -> Outcome:
        if job.kind == "disconnect":
            return await self._vanish(job)
        client = self.clients[job.index % len(self.clients)]
        request_id = f"load-{uuid.uuid4().hex}"
        status, chunks = "completed", 0
        try:
            async for delta in client.stream(job.prompt, _greedy(job), request_id=request_id):
                chunks += bool(delta.token_ids)
                if job.kind == "abort" and chunks == job.cut_after and status != "aborted":
                    await client.abort(request_id)   # the stream then ends with "abort"
                    status = "aborted"
        except QueueFull as error:
            return Outcome("refused", f"QueueFull: {error}")
        except FolioError as error:
            return Outcome("failed", f"{type(error).__name__}: {error}")
        return Outcome(status)

    async def _vanish(self, job: Job) -> Outcome:
        """A client process that dies mid-request: its socket closes, no abort is sent."""
        ctx = zmq.asyncio.Context()
        sock = configure(ctx.socket(zmq.DEALER))
        try:
            sock.connect(self.address)
            await sock.send(m.encode_generate(uuid.uuid4().hex, _greedy(job), True,
                                              prompt_token_ids=job.prompt))
            try:   # leave after the first reply (a delta, or a refusal) or the vanish time
                await asyncio.wait_for(sock.recv(), job.vanish_s)
            except asyncio.TimeoutError:
                pass
        finally:
            sock.close(0)
            ctx.term()
        return Outcome("disconnected")

    async def idle(self) -> bool:
        health = await self.clients[0].health(timeout=5.0)
        stats = health.get("stats") or {}
        return bool(health.get("ok") and stats
                    and stats.get("kv_blocks_free") == stats.get("kv_blocks_total")
                    and stats.get("num_running") == stats.get("num_waiting") == 0
                    and stats.get("num_swapped", 0) == 0)


_METRIC = re.compile(r"^(folio:[a-z_]+)(?:\{[^}]*\})?\s+([-+0-9.eEinfna]+)$")


class HttpDriver:
    def __init__(self, base_url: str, mix: Mix) -> None:
        limits = httpx.Limits(max_connections=mix.concurrency + 8,
                              max_keepalive_connections=mix.concurrency + 8)
        self.http = httpx.AsyncClient(base_url=base_url.rstrip("/"), limits=limits,
                                      trust_env=False,   # never through a proxy
                                      timeout=httpx.Timeout(mix.request_timeout, connect=10.0))

    async def close(self) -> None:
        await self.http.aclose()

    @staticmethod
    def _body(job: Job, stream: bool) -> dict[str, Any]:
        return {"prompt": job.prompt, "max_tokens": job.max_tokens, "temperature": 0.0,
                "ignore_eos": True, "stream": stream}

    async def run(self, job: Job) -> Outcome:
        if job.kind == "disconnect":
            return await self._vanish(job)
        chunks = 0
        try:
            async with self.http.stream("POST", "/v1/completions",
                                        json=self._body(job, True)) as response:
                if response.status_code != 200:
                    await response.aread()
                    return _refusal(response)
                async for line in response.aiter_lines():
                    if not line.startswith("data: ") or line == "data: [DONE]":
                        continue
                    event = json.loads(line[6:])
                    if "error" in event:
                        error = event["error"]
                        return Outcome("refused" if error.get("code") == "queue_full"
                                       else "failed", f"stream error {error.get('code')}: "
                                       f"{error.get('message')}")
                    chunks += any(c.get("text") for c in event.get("choices") or [])
                    if job.kind == "abort" and chunks == job.cut_after:
                        return Outcome("aborted")   # closing the stream aborts the request
        except httpx.HTTPError as error:
            return Outcome("failed", f"{type(error).__name__}: {error}")
        return Outcome("completed")

    async def _vanish(self, job: Job) -> Outcome:
        """A client that drops its connection before the (non-streamed) answer comes."""
        request = asyncio.create_task(self.http.post("/v1/completions",
                                                     json=self._body(job, False)))
        done, _ = await asyncio.wait({request}, timeout=job.vanish_s)
        if request in done:
            try:
                response = request.result()
            except httpx.HTTPError as error:
                return Outcome("failed", f"{type(error).__name__}: {error}")
            return Outcome("completed") if response.status_code == 200 else _refusal(response)
        request.cancel()   # httpx closes the connection: the server aborts the request
        await asyncio.gather(request, return_exceptions=True)
        return Outcome("disconnected")

    async def idle(self) -> bool:
        health = await self.http.get("/health")
        values: dict[str, float] = {}
        for line in (await self.http.get("/metrics")).text.splitlines():
            found = _METRIC.match(line)
            if found and found.group(1) not in values:
                values[found.group(1)] = float(found.group(2))
        return (health.status_code == 200
                and values.get("folio:kv_cache_usage_perc") == 0.0
                and values.get("folio:num_requests_running") == 0.0
                and values.get("folio:num_requests_waiting") == 0.0
                and values.get("folio:num_requests_swapped", 0.0) == 0.0)


def _refusal(response: httpx.Response) -> Outcome:
    try:
        error = response.json()["error"]
    except (ValueError, KeyError, TypeError):
        return Outcome("failed", f"HTTP {response.status_code}: {response.text[:200]}")
    if response.status_code == 503 and error.get("code") == "queue_full":
        return Outcome("refused", f"HTTP 503 queue_full: {error.get('message')}")
    return Outcome("failed", f"HTTP {response.status_code} {error.get('code')}: "
                   f"{error.get('message')}")


# ---- processes -----------------------------------------------------------------------------

def serve_pids(log: Path) -> dict[str, int]:
    """The roles' pids from `folio serve`'s banner ("pids: scheduler=1, executor=2, ...")."""
    lines = [ln for ln in log.read_text(errors="replace").splitlines()
             if ln.strip().startswith("pids:")]
    return {name: int(pid) for name, pid in re.findall(r"([\w-]+)=(\d+)", lines[-1])} \
        if lines else {}


# ---- running --------------------------------------------------------------------------------

async def run_round(driver, mix: Mix, rng: random.Random) -> list[Outcome]:
    """`mix.requests` jobs, `mix.concurrency` at a time; what outlasts the round timeout is
    given up (the SDK aborts what it cancels) and counted as failed."""
    outcomes: list[Outcome] = []
    jobs = iter(range(mix.requests))

    async def worker() -> None:
        for index in jobs:
            try:
                outcome = await driver.run(make_job(rng, index, mix))
            except Exception as error:   # a driver bug must not end the run silently
                outcome = Outcome("failed", f"{type(error).__name__}: {error}")
            outcomes.append(outcome)
            if outcome.status == "refused":
                await asyncio.sleep(mix.refusal_backoff_s)   # as Retry-After asks

    workers = [asyncio.create_task(worker()) for _ in range(mix.concurrency)]
    _, pending = await asyncio.wait(workers, timeout=mix.round_timeout)
    for task in pending:
        task.cancel()
    await asyncio.gather(*pending, return_exceptions=True)
    if pending:
        outcomes.append(Outcome("failed", f"gave up: still running after "
                                f"{mix.round_timeout:g} s"))
    return outcomes


async def wait_idle(driver, timeout: float) -> bool:
    """Whether the server went idle (every block back, nothing running) within `timeout`."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            if await driver.idle():
                return True
        except (FolioError, httpx.HTTPError):   # still busy answering: look again
            pass
        if time.monotonic() > deadline:
            return False
        await asyncio.sleep(0.1)


def summarize(outcomes: list[Outcome]) -> dict[str, Any]:
    counts = Counter(o.status for o in outcomes)
    return {"requests": len(outcomes), **{status: counts[status] for status in (
        "completed", "aborted", "disconnected", "refused", "failed")},
        "failures": dict(Counter((o.error or "")[:160] for o in outcomes
                                 if o.status == "failed").most_common(10))}


async def run_load(driver, mix: Mix, pids: dict[str, int], rounds: int = 2,
                   idle_timeout: float = 30.0) -> dict[str, Any]:
    """`rounds` rounds of the mix, each followed by the idle check and an RSS sample."""
    rng = random.Random(mix.seed)
    report: dict[str, Any] = {"rounds": []}
    try:
        for _ in range(rounds):
            summary = summarize(await run_round(driver, mix, rng))
            summary["idle_after"] = await wait_idle(driver, idle_timeout)
            summary["rss_mib_idle"] = {name: rss_mib(pid) for name, pid in pids.items()}
            report["rounds"].append(summary)
    finally:
        await driver.close()
    first, last = report["rounds"][0]["rss_mib_idle"], report["rounds"][-1]["rss_mib_idle"]
    report["rss_growth_mib"] = {name: None if None in (first[name], last[name])
                                else round(last[name] - first[name], 1) for name in pids}
    return report
