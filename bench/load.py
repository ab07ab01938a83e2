"""Bounded load generator for a running Folio server (loopback or ipc:// only).

    python bench/load.py --sdk ipc:///tmp/folio-k2x7c1/client.sock --requests 200 --concurrency 32
    python bench/load.py --http http://127.0.0.1:8000 --rate 20 --duration 30 --json

It drives the server through the SDK (`folio.AsyncClient`, ZeroMQ) or the OpenAI HTTP API
(`httpx`, streamed `/v1/completions`) with a mix of prompt and output lengths, some
requests aborted mid-stream (SDK `abort`, HTTP stream closed early) and some clients that
vanish (a raw ZeroMQ socket closed mid-stream, an HTTP connection dropped before the
answer), at a fixed concurrency or a Poisson request rate. It stops issuing requests after
--requests or --duration, whichever comes first, and gives up on what is left after
--drain-timeout more seconds.

It reports completed / aborted / disconnected / refused (queue full: SDK `QueueFull`, HTTP
503 with code `queue_full`, or a stream that answered 200 and then sent a `queue_full` error
event; the report counts each way) / failed counts, time to first token, inter-token latency and
end-to-end latency percentiles (p50/p90/p99), then waits for the server to go idle and
reports whether every KV block came back (SDK: `health()` stats, `kv_blocks_free ==
kv_blocks_total`; HTTP: `/metrics`, `folio:kv_cache_usage_perc == 0` with no request running
or waiting, and `/health` 200) and whether the resident memory (VmRSS from /proc) of the
folio-scheduler, folio-executor and folio-frontend processes stays flat once idle. The
processes are the pids given with --pids (or read from the "pids: ..." line `folio serve`
prints, with --serve-log), else every process whose name starts with "folio-".

Every address must be on this machine: ipc://, or tcp:// / http:// on 127.0.0.0/8,
localhost or [::1]. Anything else is refused (exit status 2, like every invalid option).
"""

from __future__ import annotations

import argparse
import asyncio
import ipaddress
import json
import random
import re
import sys
import time
import uuid
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.serve_client import percentiles as latency_summary  # noqa: E402 (after the path)

MAX_REQUESTS = 100_000
MAX_DURATION_S = 3600.0
MAX_CONCURRENCY = 4096
MIB = 2**20


# ---- addresses ------------------------------------------------------------------------------

def _loopback_host(host: str) -> bool:
    host = host.strip("[]")
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def check_local(address: str) -> str:
    """The address, if it is on this machine (ipc://, or loopback tcp:// / http(s)://)."""
    if address.startswith("ipc://"):
        return address
    if address.startswith("tcp://"):
        host = address.removeprefix("tcp://").rsplit(":", 1)[0]
    elif address.startswith(("http://", "https://")):
        host = urlsplit(address).hostname or ""
    else:
        raise ValueError(f"refusing {address!r}: give ipc://..., tcp://127.0.0.1:PORT or "
                         "http://127.0.0.1:PORT")
    if not _loopback_host(host):
        raise ValueError(f"refusing {address!r}: only loopback addresses (127.0.0.0/8, "
                         "localhost, [::1]) and ipc:// are allowed")
    return address


# ---- the workload ---------------------------------------------------------------------------

@dataclass
class Job:
    index: int
    prompt: list[int]
    max_tokens: int
    kind: str            # "normal", "abort" or "disconnect"
    cut_after: int       # abort: after this many token chunks
    vanish_s: float      # disconnect: after this many seconds (or the first token)


@dataclass
class Outcome:
    status: str          # completed, aborted, disconnected, refused, failed
    error: str | None = None
    ttft: float | None = None
    gaps: list[float] = field(default_factory=list)
    e2e: float | None = None
    tokens: int = 0


def _span(text: str, name: str) -> tuple[int, int]:
    low, _, high = text.partition(":")
    try:
        low_i, high_i = int(low), int(high or low)
    except ValueError:
        raise ValueError(f"{name} must be N or MIN:MAX, got {text!r}") from None
    if not 1 <= low_i <= high_i:
        raise ValueError(f"{name} must satisfy 1 <= MIN <= MAX, got {text!r}")
    return low_i, high_i


def make_job(rng: random.Random, index: int, args) -> Job:
    prompt_len = rng.randint(*args.prompt_len)
    prompt = [rng.randrange(args.min_token_id, args.max_token_id) for _ in range(prompt_len)]
    max_tokens = rng.randint(*args.output_len)
    draw = rng.random()
    kind = ("abort" if draw < args.abort_fraction else
            "disconnect" if draw < args.abort_fraction + args.disconnect_fraction else "normal")
    return Job(index, prompt, max_tokens, kind, cut_after=rng.randint(1, max(1, max_tokens // 2)),
               vanish_s=rng.uniform(0.02, args.max_vanish))


def _record_token(outcome: Outcome, start: float, last: float | None, count: int = 1) -> float:
    now = time.perf_counter()
    if outcome.ttft is None:
        outcome.ttft = now - start
    elif last is not None:
        outcome.gaps.append((now - last) / max(1, count))
    outcome.tokens += count
    return now


# ---- SDK driver -----------------------------------------------------------------------------

class SdkDriver:
    def __init__(self, args) -> None:
        self.args = args
        self.clients: list[Any] = []

    async def start(self) -> None:
        from folio.client import AsyncClient

        for _ in range(self.args.connections):
            client = AsyncClient(self.args.sdk, timeout=self.args.request_timeout,
                                 connect_timeout=10.0, curve_keys=self.args.curve_keys)
            await client.__aenter__()
            self.clients.append(client)

    async def close(self) -> None:
        for client in self.clients:
            await client.close()

    def _params(self, job: Job):
        from folio import SamplingParams

        return SamplingParams(temperature=self.args.temperature, max_tokens=job.max_tokens,
                              ignore_eos=self.args.ignore_eos)

    async def run(self, job: Job) -> Outcome:
        from folio.errors import FolioError, QueueFull

        if job.kind == "disconnect":
            return await self._vanish(job)
        client = self.clients[job.index % len(self.clients)]
        outcome = Outcome("completed")
        request_id = f"load-{uuid.uuid4().hex}"
        start = time.perf_counter()
        last = None
        chunks = 0
        try:
            async for delta in client.stream(job.prompt, self._params(job),
                                             request_id=request_id):
                if not delta.token_ids:
                    continue
                last = _record_token(outcome, start, last, len(delta.token_ids))
                chunks += 1
                if job.kind == "abort" and chunks == job.cut_after:
                    await client.abort(request_id)   # the stream then ends with "abort"
                    outcome.status = "aborted"
        except QueueFull as error:
            return Outcome("refused", f"QueueFull: {error}")
        except FolioError as error:
            return Outcome("failed", f"{type(error).__name__}: {error}", outcome.ttft)
        outcome.e2e = time.perf_counter() - start
        return outcome

    async def _vanish(self, job: Job) -> Outcome:
        """A client process that dies mid-request: its socket closes, no abort is sent."""
        import zmq
        import zmq.asyncio

        from folio.shared.protocol import messages as m
        from folio.shared.security import load_keys, make_client
        from folio.shared.transport import configure

        ctx = zmq.asyncio.Context()
        sock = configure(ctx.socket(zmq.DEALER))
        if self.args.curve_keys:
            keys = load_keys(self.args.curve_keys)
            make_client(sock, keys.server_public, keys.client_public, keys.client_secret)
        try:
            sock.connect(self.args.sdk)
            await sock.send(m.encode_generate(uuid.uuid4().hex, self._params(job), True,
                                              prompt_token_ids=job.prompt))
            try:   # leave after the first reply (a delta, or a refusal) or the vanish time
                await asyncio.wait_for(sock.recv(), job.vanish_s)
            except asyncio.TimeoutError:
                pass
        finally:
            sock.close(0)
            ctx.term()
        return Outcome("disconnected")

    async def idle_stats(self) -> dict[str, Any]:
        health = await self.clients[0].health(timeout=5.0)
        stats = health.get("stats") or {}
        free = (bool(stats) and stats.get("kv_blocks_free") == stats.get("kv_blocks_total")
                and stats.get("num_running") == stats.get("num_waiting") == 0
                and stats.get("num_swapped", 0) == 0)
        return {"free": bool(free and health.get("ok")), "ok": health.get("ok"),
                "kv_blocks_free": stats.get("kv_blocks_free"),
                "kv_blocks_total": stats.get("kv_blocks_total"),
                "num_running": stats.get("num_running"),
                "num_waiting": stats.get("num_waiting")}


# ---- HTTP driver ----------------------------------------------------------------------------

_METRIC = re.compile(r"^(folio:[a-z_]+)(?:\{[^}]*\})?\s+([-+0-9.eEinfna]+)$")


class HttpDriver:
    def __init__(self, args) -> None:
        self.args = args
        self.base = args.http.rstrip("/")
        self.http = None
        self.model = args.model

    async def start(self) -> None:
        import httpx

        headers = {"Authorization": f"Bearer {self.args.api_key}"} if self.args.api_key else {}
        limits = httpx.Limits(max_connections=self.args.concurrency + 8,
                              max_keepalive_connections=self.args.concurrency + 8)
        self.http = httpx.AsyncClient(base_url=self.base, headers=headers, limits=limits,
                                      trust_env=False,   # never through a proxy
                                      timeout=httpx.Timeout(self.args.request_timeout,
                                                            connect=10.0))
        if self.model is None:
            response = await self.http.get("/v1/models")
            response.raise_for_status()
            self.model = response.json()["data"][0]["id"]

    async def close(self) -> None:
        await self.http.aclose()

    def _body(self, job: Job, stream: bool) -> dict[str, Any]:
        return {"model": self.model, "prompt": job.prompt, "max_tokens": job.max_tokens,
                "temperature": self.args.temperature, "ignore_eos": self.args.ignore_eos,
                "stream": stream}

    async def run(self, job: Job) -> Outcome:
        import httpx

        if job.kind == "disconnect":
            return await self._vanish(job)
        outcome = Outcome("completed")
        start = time.perf_counter()
        last = None
        chunks = 0
        try:
            async with self.http.stream("POST", "/v1/completions",
                                        json=self._body(job, True)) as response:
                if response.status_code != 200:
                    await response.aread()
                    return self._refusal(response)
                async for line in response.aiter_lines():
                    if not line.startswith("data: ") or line == "data: [DONE]":
                        continue
                    event = json.loads(line[6:])
                    if "error" in event:
                        error = event["error"]
                        status = "refused" if error.get("code") == "queue_full" else "failed"
                        return Outcome(status, f"stream error {error.get('code')}: "
                                       f"{error.get('message')}", outcome.ttft)
                    choices = event.get("choices") or []
                    if not choices or not choices[0].get("text") and \
                            choices[0].get("finish_reason") is not None:
                        continue
                    last = _record_token(outcome, start, last)
                    chunks += 1
                    if job.kind == "abort" and chunks == job.cut_after:
                        outcome.status = "aborted"   # closing the stream aborts the request
                        break
        except httpx.HTTPError as error:
            return Outcome("failed", f"{type(error).__name__}: {error}", outcome.ttft)
        outcome.e2e = time.perf_counter() - start
        return outcome

    def _refusal(self, response) -> Outcome:
        try:
            error = response.json()["error"]
        except (ValueError, KeyError, TypeError):
            return Outcome("failed", f"HTTP {response.status_code}: {response.text[:200]}")
        if response.status_code == 503 and error.get("code") == "queue_full":
            return Outcome("refused", f"HTTP 503 queue_full: {error.get('message')}")
        return Outcome("failed", f"HTTP {response.status_code} {error.get('code')}: "
                       f"{error.get('message')}")

    async def _vanish(self, job: Job) -> Outcome:
        """A client that drops its connection before the (non-streamed) answer comes."""
        import httpx

        request = asyncio.create_task(self.http.post("/v1/completions",
                                                     json=self._body(job, False)))
        done, _ = await asyncio.wait({request}, timeout=job.vanish_s)
        if request in done:
            try:
                response = request.result()
            except httpx.HTTPError as error:
                return Outcome("failed", f"{type(error).__name__}: {error}")
            if response.status_code == 200:
                return Outcome("completed", tokens=job.max_tokens)
            return self._refusal(response)
        request.cancel()   # httpx closes the connection: the server aborts the request
        await asyncio.gather(request, return_exceptions=True)
        return Outcome("disconnected")

    async def metrics(self) -> dict[str, float]:
        text = (await self.http.get("/metrics")).text
        values: dict[str, float] = {}
        for line in text.splitlines():
            found = _METRIC.match(line)
            if found and found.group(1) not in values:
                values[found.group(1)] = float(found.group(2))
        return values

    async def idle_stats(self) -> dict[str, Any]:
        health = await self.http.get("/health")
        values = await self.metrics()
        usage = values.get("folio:kv_cache_usage_perc")
        running = values.get("folio:num_requests_running")
        waiting = values.get("folio:num_requests_waiting")
        swapped = values.get("folio:num_requests_swapped", 0.0)
        free = (health.status_code == 200 and usage == 0.0 and running == 0.0
                and waiting == 0.0 and swapped == 0.0)
        return {"free": free, "ok": health.status_code == 200, "kv_cache_usage_perc": usage,
                "num_running": running, "num_waiting": waiting}


# ---- processes and memory -------------------------------------------------------------------

def find_pids(args) -> dict[str, int]:
    if args.pids:
        pids = {}
        for item in args.pids.split(","):
            name, _, pid = item.rpartition("=")
            pids[name or f"pid{pid}"] = int(pid)
        return pids
    if args.serve_log:
        text = Path(args.serve_log).read_text(errors="replace")
        line = [ln for ln in text.splitlines() if ln.strip().startswith("pids:")]
        if not line:
            raise SystemExit(f"load.py: no 'pids:' line in {args.serve_log}")
        return {name: int(pid) for name, pid in re.findall(r"(\w+)=(\d+)", line[-1])}
    pids = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            comm = (entry / "comm").read_text().strip()
        except OSError:
            continue
        if comm.startswith("folio-"):
            pids[f"{comm.removeprefix('folio-')}-{entry.name}"] = int(entry.name)
    return pids


def rss_mib(pid: int) -> float | None:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024 / MIB
    except OSError:
        return None
    return None


def alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state not in ("Z", "X")


def snapshot(pids: dict[str, int]) -> dict[str, float | None]:
    return {name: None if rss is None else round(rss, 1)
            for name, rss in ((name, rss_mib(pid)) for name, pid in pids.items())}


# ---- running --------------------------------------------------------------------------------

def percentiles(values: list[float]) -> dict[str, Any]:
    """The count, and mean and p50/p90/p99 in milliseconds (the values are seconds)."""
    ms = {k: None if v is None else round(v * 1e3, 2) for k, v in latency_summary(values).items()}
    return {"n": len(values), **ms}


async def run_round(driver, args, rng: random.Random) -> tuple[list[Outcome], float]:
    outcomes: list[Outcome] = []
    started = time.perf_counter()
    stop_issuing = started + args.duration
    counter = iter(range(args.requests))

    async def guarded(job: Job) -> Outcome:
        try:
            outcome = await driver.run(job)
        except Exception as error:   # a driver bug must not end the run silently
            outcome = Outcome("failed", f"{type(error).__name__}: {error}")
        outcomes.append(outcome)
        return outcome

    if args.rate is None:
        async def worker() -> None:
            for index in counter:
                if time.perf_counter() >= stop_issuing:
                    return
                if (await guarded(make_job(rng, index, args))).status == "refused":
                    await asyncio.sleep(args.refusal_backoff)   # as Retry-After asks

        workers = [asyncio.create_task(worker()) for _ in range(args.concurrency)]
    else:
        limit = asyncio.Semaphore(args.concurrency)

        async def limited(job: Job) -> None:
            async with limit:
                await guarded(job)

        async def dispatch() -> None:
            tasks = []
            for index in counter:
                if time.perf_counter() >= stop_issuing:
                    break
                tasks.append(asyncio.create_task(limited(make_job(rng, index, args))))
                await asyncio.sleep(rng.expovariate(args.rate))
            await asyncio.gather(*tasks)

        workers = [asyncio.create_task(dispatch())]
    hard_stop = args.duration + args.drain_timeout
    done, pending = await asyncio.wait(workers, timeout=hard_stop)
    for task in pending:   # past the hard limit: abandon what is left (the SDK aborts it)
        task.cancel()
    await asyncio.gather(*pending, return_exceptions=True)
    if pending:
        outcomes.append(Outcome("failed", f"gave up: still running after {hard_stop:g} s"))
    return outcomes, time.perf_counter() - started


async def wait_idle(driver, timeout: float) -> tuple[dict[str, Any], float]:
    started = time.perf_counter()
    while True:
        try:
            stats = await driver.idle_stats()
        except Exception as error:
            stats = {"free": False, "error": f"{type(error).__name__}: {error}"}
        elapsed = time.perf_counter() - started
        if stats["free"] or elapsed > timeout:
            return stats, elapsed
        await asyncio.sleep(0.1)


def summarize(outcomes: list[Outcome], wall: float) -> dict[str, Any]:
    counts = Counter(o.status for o in outcomes)
    failures = Counter((o.error or "")[:160] for o in outcomes if o.status == "failed")
    refusals = Counter((o.error or "").split(":", 1)[0] for o in outcomes
                       if o.status == "refused")
    tokens = sum(o.tokens for o in outcomes)
    return {
        "requests": len(outcomes),
        "completed": counts["completed"], "aborted": counts["aborted"],
        "disconnected": counts["disconnected"], "refused": counts["refused"],
        "failed": counts["failed"], "failures": dict(failures.most_common(10)),
        "refusals": dict(refusals),
        "wall_s": round(wall, 2), "output_tokens": tokens,
        "output_tok_s": round(tokens / wall, 1) if wall > 0 else None,
        "ttft_ms": percentiles([o.ttft for o in outcomes
                                if o.ttft is not None and o.status != "failed"]),
        "itl_ms": percentiles([g for o in outcomes for g in o.gaps]),
        "e2e_ms": percentiles([o.e2e for o in outcomes
                               if o.e2e is not None and o.status == "completed"])}


async def main_async(args) -> dict[str, Any]:
    driver = SdkDriver(args) if args.sdk else HttpDriver(args)
    pids = find_pids(args)
    await driver.start()
    rng = random.Random(args.seed)
    report: dict[str, Any] = {
        "target": args.sdk or args.http, "via": "sdk" if args.sdk else "http",
        "date": time.strftime("%Y-%m-%d %H:%M:%S"),
        "settings": {k: getattr(args, k) for k in (
            "requests", "duration", "concurrency", "refusal_backoff", "rate", "prompt_len",
            "output_len",
            "abort_fraction", "disconnect_fraction", "temperature", "ignore_eos", "seed",
            "rounds")},
        "pids": pids, "rounds": []}
    try:
        idle_before, _ = await wait_idle(driver, args.idle_wait)
        report["idle_before"] = idle_before
        report["rss_mib_before"] = snapshot(pids)
        for _ in range(args.rounds):
            outcomes, wall = await run_round(driver, args, rng)
            summary = summarize(outcomes, wall)
            idle, seconds = await wait_idle(driver, args.idle_wait)
            summary["kv_free_after"] = idle["free"]
            summary["seconds_to_idle"] = round(seconds, 2)
            summary["idle_stats"] = idle
            summary["rss_mib_idle"] = snapshot(pids)
            report["rounds"].append(summary)
        await asyncio.sleep(args.memory_window)
        report["rss_mib_idle_end"] = snapshot(pids)
    finally:
        await driver.close()
    report["memory"] = memory_verdict(report, args.memory_tolerance)
    report["processes_alive"] = {name: alive(pid) for name, pid in pids.items()}
    report["kv_free_after"] = all(r["kv_free_after"] for r in report["rounds"])
    return report


def memory_verdict(report: dict[str, Any], tolerance: float) -> dict[str, Any]:
    """Flat: once idle, no process grew by more than `tolerance` MiB, neither during the
    idle window after the last round nor from the first round's idle to the last's."""
    first = report["rounds"][0]["rss_mib_idle"] if report["rounds"] else {}
    last = report["rounds"][-1]["rss_mib_idle"] if report["rounds"] else {}
    end = report.get("rss_mib_idle_end", {})
    growth = {}
    for name in end:
        if end.get(name) is None or last.get(name) is None:
            continue
        growth[name] = {"idle_window": round(end[name] - last[name], 1),
                        "across_rounds": round(last[name] - first[name], 1),
                        "since_start": None if report["rss_mib_before"].get(name) is None
                        else round(end[name] - report["rss_mib_before"][name], 1)}
    flat = bool(growth) and all(g["idle_window"] <= tolerance and
                                g["across_rounds"] <= tolerance for g in growth.values())
    return {"flat": flat, "tolerance_mib": tolerance, "growth_mib": growth}


def print_report(report: dict[str, Any]) -> None:
    print(f"Folio load via {report['via']} at {report['target']} ({report['date']})")
    for i, r in enumerate(report["rounds"], 1):
        print(f"round {i}: {r['requests']} requests in {r['wall_s']} s: "
              f"completed {r['completed']}, aborted {r['aborted']}, disconnected "
              f"{r['disconnected']}, refused {r['refused']}, failed {r['failed']}; "
              f"{r['output_tokens']} tokens ({r['output_tok_s']} tok/s)")
        for name in ("ttft_ms", "itl_ms", "e2e_ms"):
            p = r[name]
            print(f"  {name:8s} p50 {p['p50']}  p90 {p['p90']}  p99 {p['p99']}  "
                  f"(n={p['n']})")
        for error, count in r["failures"].items():
            print(f"  failed x{count}: {error}")
        for how, count in r["refusals"].items():
            print(f"  refused x{count}: {how}")
        print(f"  KV blocks all free after: {r['kv_free_after']} "
              f"(idle after {r['seconds_to_idle']} s: {r['idle_stats']})")
    memory = report["memory"]
    print(f"memory (VmRSS MiB) before {report['rss_mib_before']}, idle end "
          f"{report['rss_mib_idle_end']}")
    print(f"memory flat once idle (tolerance {memory['tolerance_mib']} MiB): "
          f"{memory['flat']}  growth {memory['growth_mib']}")
    print(f"processes alive: {report['processes_alive']}")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="bench/load.py", description=__doc__.split("\n\n", 1)[0],
        epilog=__doc__.split("\n\n", 1)[1], formatter_class=argparse.RawDescriptionHelpFormatter)
    target = parser.add_argument_group("target (exactly one)")
    where = target.add_mutually_exclusive_group(required=True)
    where.add_argument("--sdk", metavar="ADDRESS",
                       help="drive the ZeroMQ SDK at this address (ipc://... or "
                       "tcp://127.0.0.1:PORT; `folio serve` prints it as 'clients connect to')")
    where.add_argument("--http", metavar="URL",
                       help="drive the OpenAI HTTP API at this base URL "
                       "(http://127.0.0.1:8000), streamed /v1/completions")
    target.add_argument("--api-key", help="HTTP: the server's --api-key")
    target.add_argument("--model", help="HTTP: the model name (default: the first of "
                        "/v1/models)")
    target.add_argument("--curve-keys", metavar="DIR", help="SDK: CURVE keys directory")
    target.add_argument("--connections", type=int, default=4,
                        help="SDK: AsyncClient connections the requests are spread over "
                        "(default 4)")

    bounds = parser.add_argument_group("bounds and pacing")
    bounds.add_argument("--requests", type=int, default=100,
                        help=f"requests per round, at most {MAX_REQUESTS} (default 100)")
    bounds.add_argument("--duration", type=float, default=60.0,
                        help="stop issuing requests after this many seconds per round, at "
                        f"most {MAX_DURATION_S:g} (default 60)")
    bounds.add_argument("--drain-timeout", type=float, default=60.0,
                        help="then wait this long for requests in flight before giving up "
                        "on them (default 60)")
    bounds.add_argument("--concurrency", type=int, default=16,
                        help="requests in flight at once; with --rate, the most in flight "
                        f"(default 16, at most {MAX_CONCURRENCY})")
    bounds.add_argument("--refusal-backoff", type=float, default=1.0,
                        help="with --concurrency, a client whose request was refused (queue "
                        "full) waits this long before its next one, as the server's "
                        "Retry-After asks; 0: retry at once (default 1.0)")
    bounds.add_argument("--rate", type=float, default=None,
                        help="requests per second (Poisson arrivals) instead of a fixed "
                        "concurrency")
    bounds.add_argument("--rounds", type=int, default=1,
                        help="run the same load this many times, waiting for idle after each; "
                        "with 2 or more, memory growth from round to round is checked "
                        "(default 1)")
    bounds.add_argument("--request-timeout", type=float, default=120.0,
                        help="seconds to wait for each reply (default 120)")

    mix = parser.add_argument_group("workload mix")
    mix.add_argument("--prompt-len", default="8:256", metavar="MIN:MAX",
                     help="prompt length in tokens, uniform (default 8:256)")
    mix.add_argument("--output-len", default="8:128", metavar="MIN:MAX",
                     help="max_tokens, uniform (default 8:128)")
    mix.add_argument("--min-token-id", type=int, default=10,
                     help="prompt token ids are drawn from [min, max) (default 10)")
    mix.add_argument("--max-token-id", type=int, default=1000,
                     help="must not exceed the model's vocabulary (default 1000)")
    mix.add_argument("--abort-fraction", type=float, default=0.1,
                     help="share of requests aborted mid-stream: SDK abort(), or the HTTP "
                     "stream closed, after a random number of tokens (default 0.1)")
    mix.add_argument("--disconnect-fraction", type=float, default=0.05,
                     help="share of clients that vanish: SDK, a raw socket closed mid-stream; "
                     "HTTP, a non-streamed request whose connection is dropped (default 0.05)")
    mix.add_argument("--max-vanish", type=float, default=1.0,
                     help="a vanishing client leaves after a uniform 0.02..this many seconds "
                     "(SDK: or at its first reply) (default 1.0)")
    mix.add_argument("--temperature", type=float, default=0.0, help="(default 0: greedy)")
    mix.add_argument("--ignore-eos", action=argparse.BooleanOptionalAction, default=True,
                     help="generate exactly max_tokens (default on)")
    mix.add_argument("--seed", type=int, default=0, help="workload seed (default 0)")

    checks = parser.add_argument_group("idle checks")
    checks.add_argument("--idle-wait", type=float, default=30.0,
                        help="after each round, wait up to this long for every KV block to "
                        "be free and nothing running or waiting (default 30)")
    checks.add_argument("--memory-window", type=float, default=5.0,
                        help="then stay idle this long and measure RSS again (default 5)")
    checks.add_argument("--memory-tolerance", type=float, default=16.0, metavar="MIB",
                        help="growth in MiB still counted as flat (default 16)")
    checks.add_argument("--pids", help="processes to watch: NAME=PID,NAME=PID or PID,PID "
                        "(default: every process named folio-*)")
    checks.add_argument("--serve-log", metavar="FILE",
                        help="read the pids from the 'pids: ...' line `folio serve` printed")

    out = parser.add_argument_group("output")
    out.add_argument("--json", action="store_true", help="print one JSON object")
    out.add_argument("--check", action="store_true",
                     help="exit 1 unless nothing failed, every block came back, memory "
                     "stayed flat and every watched process is alive")
    return parser


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = build_parser()
    args = parser.parse_args(argv)
    problems = []
    try:
        check_local(args.sdk or args.http)
        args.prompt_len = _span(args.prompt_len, "--prompt-len")
        args.output_len = _span(args.output_len, "--output-len")
    except ValueError as error:
        parser.error(str(error))
    if not 1 <= args.requests <= MAX_REQUESTS:
        problems.append(f"--requests must be in [1, {MAX_REQUESTS}]")
    if not 0 < args.duration <= MAX_DURATION_S:
        problems.append(f"--duration must be in (0, {MAX_DURATION_S:g}]")
    if not 0 <= args.drain_timeout <= MAX_DURATION_S:
        problems.append(f"--drain-timeout must be in [0, {MAX_DURATION_S:g}]")
    if not 1 <= args.concurrency <= MAX_CONCURRENCY:
        problems.append(f"--concurrency must be in [1, {MAX_CONCURRENCY}]")
    if args.rate is not None and not 0 < args.rate <= 10_000:
        problems.append("--rate must be in (0, 10000]")
    if not 1 <= args.rounds <= 10:
        problems.append("--rounds must be in [1, 10]")
    if not 1 <= args.connections <= 64:
        problems.append("--connections must be in [1, 64]")
    if not (0 <= args.abort_fraction and 0 <= args.disconnect_fraction
            and args.abort_fraction + args.disconnect_fraction <= 1):
        problems.append("--abort-fraction and --disconnect-fraction must be >= 0, sum <= 1")
    if not 0 <= args.min_token_id < args.max_token_id:
        problems.append("need 0 <= --min-token-id < --max-token-id")
    for name in ("idle_wait", "memory_window", "max_vanish", "request_timeout",
                 "refusal_backoff"):
        if not 0 <= getattr(args, name) <= MAX_DURATION_S:
            problems.append(f"--{name.replace('_', '-')} must be in [0, {MAX_DURATION_S:g}]")
    if problems:
        parser.error("; ".join(problems))
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    report = asyncio.run(main_async(args))
    if args.json:
        print(json.dumps(report, indent=2))
    else:
        print_report(report)
    healthy = (report["kv_free_after"] and report["memory"]["flat"]
               and all(report["processes_alive"].values())
               and not any(r["failed"] for r in report["rounds"]))
    return 0 if healthy or not args.check else 1


if __name__ == "__main__":
    sys.exit(main())
