"""Chaos soak: mixed load while processes are killed and stopped at random.

    python -m bench.chaos --minutes 3                 # the built-in model
    python -m bench.chaos --seconds 20 --model DIR    # a short run (the suite's smoke test)

Starts a scheduler, an executor and two frontends (the first with the HTTP API) on ipc://
sockets in a private directory, and runs `--clients` concurrent loops of mixed requests:
SDK generate and streams, SDK streams left early (aborts), HTTP completions with n = 2,
HTTP streams, HTTP streams whose client vanishes mid-stream, and SDK clients that send a
request and vanish. Meanwhile a chaos loop, every few seconds, does one of: SIGKILL the
executor (restarted), SIGSTOP it for 1-3 s, SIGKILL or SIGSTOP the SDK-only frontend, SIGSTOP
the HTTP frontend, SIGSTOP or (rarely) SIGKILL the scheduler (restarted).

Every prompt is greedy with a known answer (computed before the chaos starts), so each
request is judged: `ok` (the exact answer), `error` (a clear error: a Folio exception, an
HTTP status with the error envelope, an SSE error event), `wrong` (any other output: mixed
up, duplicated, cut), `double` (anything after its end: a second final, events after an
error or after [DONE]) or `hung` (no end within --request-timeout). Requests we abandon on
purpose count as `left`. At the end, with the load stopped and the processes healed, every
KV block must be free and nothing running; the frontend's and scheduler's RSS are sampled
every few seconds (the HTTP frontend is never killed, so its RSS spans the run).

Exit status 0 when nothing was wrong, doubled or hung, no block leaked and the frontend's
RSS grew by less than --rss-slack-mib; the summary is printed as JSON (and written to
--out).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import signal
import subprocess
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path

import httpx

from folio import SamplingParams
from folio.client import AsyncClient, Client
from folio.errors import FolioError
from folio.shared.protocol import messages as m
ROOT = Path(__file__).resolve().parent.parent
GREEDY = dict(temperature=0, ignore_eos=True)
NUM_KV_BLOCKS = 256
# (action, process, weight): the HTTP frontend is only stopped, so its RSS spans the run.
FAULTS = [("kill", "executor", 4), ("stop", "executor", 3), ("kill", "frontend1", 2),
          ("stop", "frontend1", 2), ("stop", "frontend0", 1), ("stop", "scheduler", 2),
          ("kill", "scheduler", 1)]


def _spawn(args: list[str], log: Path) -> subprocess.Popen:
    env = dict(os.environ, PYTHONPATH=str(ROOT), PYTHONUNBUFFERED="1")
    return subprocess.Popen([sys.executable, "-m", "folio", *args], cwd=ROOT, env=env,
                            stdout=open(log, "ab"), stderr=subprocess.STDOUT)


def _free_port() -> int:
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _rss_mib(pid: int) -> float | None:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    except OSError:
        return None
    return None


class Cluster:
    """The four processes, each restartable as it was started."""

    def __init__(self, run_dir: Path, model: str) -> None:
        self.run_dir, self.model = run_dir, model
        self.frontend_address = f"ipc://{run_dir}/sched-fe.sock"
        self.executor_address = f"ipc://{run_dir}/sched-ex.sock"
        self.clients = [f"ipc://{run_dir}/client{i}.sock" for i in range(2)]
        self.port = _free_port()
        self.base = f"http://127.0.0.1:{self.port}"
        self.procs: dict[str, subprocess.Popen] = {}
        self.stopped: set[str] = set()
        for name in ("scheduler", "executor", "frontend0", "frontend1"):
            self.start(name)

    def start(self, name: str) -> None:
        log = self.run_dir / f"{name}.log"
        if name == "scheduler":
            args = ["scheduler", "--frontend-address", self.frontend_address,
                    "--executor-address", self.executor_address, "--max-queued-requests", "200"]
        elif name == "executor":
            args = ["executor", "--model", self.model, "--scheduler-address",
                    self.executor_address, "--dtype", "float32", "--num-kv-blocks",
                    str(NUM_KV_BLOCKS)]
        else:
            index = int(name[-1])
            args = ["frontend", "--model", self.model, "--client-address", self.clients[index],
                    "--scheduler-address", self.frontend_address]
            if index == 0:
                args += ["--port", str(self.port)]
        self.procs[name] = _spawn(args, log)

    def kill(self, name: str) -> None:
        proc = self.procs[name]
        proc.kill()
        proc.wait(timeout=10)
        self.stopped.discard(name)

    def stop(self, name: str) -> None:
        os.kill(self.procs[name].pid, signal.SIGSTOP)
        self.stopped.add(name)

    def resume(self, name: str) -> None:
        os.kill(self.procs[name].pid, signal.SIGCONT)
        self.stopped.discard(name)

    def heal(self) -> None:
        for name in list(self.stopped):
            self.resume(name)
        for name, proc in self.procs.items():
            if proc.poll() is not None:
                self.start(name)

    def health(self, index: int, timeout: float = 2.0) -> dict:
        try:
            with Client(self.clients[index], connect_timeout=timeout) as client:
                return client.health(timeout=timeout)
        except FolioError:
            return {}

    def wait_serving(self, timeout: float) -> float:
        """Seconds until both frontends and the HTTP API report a live engine."""
        start = time.monotonic()
        while time.monotonic() - start < timeout:
            self.heal()
            ok = all(self.health(i).get("ok") for i in range(2))
            try:
                ok = ok and httpx.get(f"{self.base}/health", timeout=2).status_code == 200
            except httpx.HTTPError:
                ok = False
            if ok:
                return time.monotonic() - start
            time.sleep(0.2)
        raise TimeoutError(f"not serving after {timeout:.0f} s; see logs in {self.run_dir}")

    def close(self) -> None:
        for name in list(self.stopped):
            self.resume(name)
        for proc in self.procs.values():
            if proc.poll() is None:
                proc.terminate()
        for proc in self.procs.values():
            try:
                proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                proc.kill()


class Soak:
    def __init__(self, cluster: Cluster, args: argparse.Namespace) -> None:
        self.cluster, self.args = cluster, args
        self.rng = random.Random(args.seed)
        self.outcomes: Counter = Counter()
        self.by_kind: dict[str, Counter] = {}
        self.problems: list[str] = []
        self.faults: Counter = Counter()
        self.recoveries: list[float] = []
        self.rss: dict[str, list[tuple[float, int, float]]] = {}   # name -> (t, pid, MiB)
        self.prompts: list[tuple[list[int], int]] = []
        self.answers: dict[int, tuple[list[int], str]] = {}   # prompt index -> ids, text
        self.until = 0.0

    # ---- references -----------------------------------------------------------------

    def make_references(self) -> None:
        vocab = self.args.vocab
        for _ in range(self.args.prompts):
            prompt = [self.rng.randrange(3, vocab) for _ in range(self.rng.randint(4, 40))]
            self.prompts.append((prompt, self.rng.randint(8, 48)))
        async def answer_all() -> None:   # together: one batch, not one request at a time
            async with AsyncClient(self.cluster.clients[0], connect_timeout=10) as client:
                done = await asyncio.gather(*(client.generate(
                    prompt, SamplingParams(max_tokens=max_tokens, **GREEDY), timeout=120)
                    for prompt, max_tokens in self.prompts))
            for index, completion in enumerate(done):
                self.answers[index] = (completion.token_ids, completion.text)

        asyncio.run(answer_all())

    # ---- one request of each kind -----------------------------------------------------

    def record(self, kind: str, outcome: str, detail: str = "") -> None:
        self.outcomes[outcome] += 1
        self.by_kind.setdefault(kind, Counter())[outcome] += 1
        if outcome in ("wrong", "double", "hung") and len(self.problems) < 50:
            self.problems.append(f"{kind}: {outcome}: {detail}"[:400])

    async def sdk_generate(self, client: AsyncClient, index: int) -> str:
        prompt, max_tokens = self.prompts[index]
        try:
            done = await client.generate(prompt, SamplingParams(max_tokens=max_tokens, **GREEDY),
                                         timeout=self.args.request_timeout)
        except FolioError:
            return "error"
        return "ok" if done.token_ids == self.answers[index][0] else "wrong"

    async def sdk_stream(self, client: AsyncClient, index: int, leave_after: int | None) -> str:
        prompt, max_tokens = self.prompts[index]
        ids: list[int] = []
        try:
            async for delta in client.stream(prompt, SamplingParams(max_tokens=max_tokens,
                                                                    **GREEDY),
                                             timeout=self.args.request_timeout):
                ids.extend(delta.token_ids)
                if leave_after is not None and len(ids) >= leave_after:
                    break   # abandoned: the SDK aborts it
        except FolioError:
            return "error"
        expected = self.answers[index][0]
        if leave_after is not None and len(ids) < len(expected):
            return "left" if ids == expected[:len(ids)] else "wrong"
        return "ok" if ids == expected else "wrong"

    async def http_n2(self, http: httpx.AsyncClient, index: int) -> str:
        prompt, max_tokens = self.prompts[index]
        try:
            response = await http.post("/v1/completions", json={
                "prompt": prompt, "max_tokens": max_tokens, "n": 2, **GREEDY})
        except httpx.HTTPError:
            return "error"
        if response.status_code != 200:
            return "error" if "error" in response.json() else "wrong"
        texts = [choice["text"] for choice in response.json()["choices"]]
        return "ok" if texts == [self.answers[index][1]] * 2 else "wrong"

    async def http_stream(self, http: httpx.AsyncClient, index: int, vanish: bool) -> str:
        prompt, max_tokens = self.prompts[index]
        text, ended, events = "", None, 0
        body = {"prompt": prompt, "max_tokens": max_tokens, "stream": True, **GREEDY}
        try:
            async with http.stream("POST", "/v1/completions", json=body) as response:
                if response.status_code != 200:
                    await response.aread()
                    return "error" if "error" in response.json() else "wrong"
                async for line in response.aiter_lines():
                    if not line.startswith("data: "):
                        continue
                    if ended is not None:
                        return "double"   # anything after an error event or [DONE]
                    if line == "data: [DONE]":
                        ended = "done"
                        continue
                    event = json.loads(line[6:])
                    if "error" in event:
                        ended = "error"
                        continue
                    text += "".join(c["text"] for c in event.get("choices", []))
                    events += 1
                    if vanish and events >= 2:
                        return "left"   # the connection closes under the server
        except httpx.HTTPError:
            return "error"
        if ended == "error":
            return "error"
        return "ok" if ended == "done" and text == self.answers[index][1] else "wrong"

    async def sdk_vanish(self, index: int) -> str:
        """A client that sends a stream request and disappears without a word (its socket
        closes with nothing more sent): the frontend must abort it on its own."""
        import zmq

        prompt, max_tokens = self.prompts[index]
        ctx = zmq.Context()
        sock = ctx.socket(zmq.DEALER)
        sock.setsockopt(zmq.LINGER, 200)
        try:
            sock.connect(self.cluster.clients[self.rng.randrange(2)])
            sock.send(m.encode_generate(f"vanish-{self.rng.random()}", SamplingParams(
                max_tokens=max_tokens, **GREEDY), True, prompt_token_ids=prompt))
            await asyncio.sleep(self.rng.uniform(0.05, 0.5))
        finally:
            sock.close()
            ctx.term()
        return "left"

    async def one_request(self, worker: int, sdk: list[AsyncClient],
                          http: httpx.AsyncClient) -> None:
        index = self.rng.randrange(len(self.prompts))
        kind = self.rng.choice(["sdk", "sdk_stream", "sdk_abort", "http_n2", "http_stream",
                                "http_vanish", "sdk_vanish"])
        client = sdk[self.rng.randrange(2)]
        if kind == "sdk":
            work = self.sdk_generate(client, index)
        elif kind == "sdk_stream":
            work = self.sdk_stream(client, index, None)
        elif kind == "sdk_abort":
            work = self.sdk_stream(client, index, self.rng.randint(1, 6))
        elif kind == "http_n2":
            work = self.http_n2(http, index)
        elif kind == "sdk_vanish":
            work = self.sdk_vanish(index)
        else:
            work = self.http_stream(http, index, kind == "http_vanish")
        try:
            outcome = await asyncio.wait_for(work, self.args.request_timeout + 30)
        except asyncio.TimeoutError:
            outcome = "hung"
        except Exception as error:   # a crash of the soak itself is a finding too
            outcome, kind = "wrong", f"{kind} ({type(error).__name__}: {error})"
        self.record(kind, outcome, f"prompt {index}")
        if outcome == "error":   # the engine is down or recovering: back off a little
            await asyncio.sleep(self.rng.uniform(0.1, 0.4))

    async def worker(self, worker: int) -> None:
        sdk = [AsyncClient(address, connect_timeout=5) for address in self.cluster.clients]
        async with httpx.AsyncClient(base_url=self.cluster.base, timeout=httpx.Timeout(
                self.args.request_timeout, connect=5)) as http:
            try:
                while time.monotonic() < self.until:
                    await self.one_request(worker, sdk, http)
            finally:
                for client in sdk:
                    await client.close()

    # ---- chaos and sampling -------------------------------------------------------------

    async def chaos(self) -> None:
        cluster = self.cluster
        choices = [(action, name) for action, name, weight in FAULTS for _ in range(weight)
                   if f"{action}-{name}" in self.args.faults.split(",")]
        span = self.until - time.monotonic()   # a short run still gets its faults
        await asyncio.sleep(min(self.rng.uniform(2, 4), 0.15 * span))
        while time.monotonic() < self.until - min(3.0, 0.25 * span):
            action, name = self.rng.choice(choices)
            self.faults[f"{action} {name}"] += 1
            if action == "kill":
                cluster.kill(name)
                await asyncio.sleep(self.rng.uniform(0.2, 1.0))
                cluster.start(name)
            else:
                cluster.stop(name)
                await asyncio.sleep(self.rng.uniform(1.0, 3.0))
                cluster.resume(name)
            try:
                self.recoveries.append(await asyncio.to_thread(cluster.wait_serving, 60))
            except TimeoutError as error:
                self.problems.append(f"no recovery after {action} {name}: {error}")
                return
            await asyncio.sleep(self.rng.uniform(self.args.fault_gap / 2, self.args.fault_gap))

    async def sample_rss(self) -> None:
        start = time.monotonic()
        while time.monotonic() < self.until:
            for name in ("frontend0", "scheduler"):
                pid = self.cluster.procs[name].pid
                rss = _rss_mib(pid)
                if rss is not None and name not in self.cluster.stopped:
                    self.rss.setdefault(name, []).append((time.monotonic() - start, pid, rss))
            await asyncio.sleep(2)

    async def run(self, seconds: float) -> None:
        self.until = time.monotonic() + seconds
        tasks = [self.worker(i) for i in range(self.args.clients)]
        await asyncio.gather(self.chaos(), self.sample_rss(), *tasks)

    # ---- the verdict ----------------------------------------------------------------------

    def idle_stats(self, timeout: float = 60) -> dict:
        deadline = time.monotonic() + timeout
        stats: dict = {}
        while time.monotonic() < deadline:
            stats = self.cluster.health(0).get("stats", {})
            if (stats.get("kv_blocks_total") and stats.get("num_running") == 0
                    and stats.get("num_waiting") == 0
                    and stats.get("kv_blocks_free") == stats.get("kv_blocks_total")):
                return stats
            time.sleep(0.25)
        return stats

    def rss_growth(self) -> dict:
        """Per process: MiB from the median of the first samples of its longest-lived
        incarnation to the median of its last ones."""
        growth = {}
        for name, samples in self.rss.items():
            by_pid: dict[int, list[float]] = {}
            for _, pid, rss in samples:
                by_pid.setdefault(pid, []).append(rss)
            longest = max(by_pid.values(), key=len)
            if len(longest) < 4:
                continue
            k = max(2, len(longest) // 5)
            first, last = sorted(longest[:k])[k // 2], sorted(longest[-k:])[k // 2]
            growth[name] = {"samples": len(longest), "first_mib": round(first, 1),
                            "last_mib": round(last, 1), "growth_mib": round(last - first, 1)}
        return growth


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default=None, help="checkpoint (default: the built-in one)")
    length = parser.add_mutually_exclusive_group()
    length.add_argument("--minutes", type=float, default=None)
    length.add_argument("--seconds", type=float, default=None)
    parser.add_argument("--clients", type=int, default=12, help="concurrent request loops")
    parser.add_argument("--prompts", type=int, default=24, help="distinct greedy prompts")
    parser.add_argument("--vocab", type=int, default=1000, help="prompt ids drawn below this")
    parser.add_argument("--fault-gap", type=float, default=6.0,
                        help="seconds between faults (drawn from [gap/2, gap])")
    parser.add_argument("--faults", default=",".join(f"{a}-{n}" for a, n, _ in FAULTS),
                        help="which faults to draw from (default: all), comma-separated")
    parser.add_argument("--request-timeout", type=float, default=60.0)
    parser.add_argument("--rss-slack-mib", type=float, default=64.0)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", default=None, help="also write the summary JSON here")
    args = parser.parse_args(argv)
    seconds = args.seconds if args.seconds is not None else 60 * (args.minutes or 3)
    from folio.default_model import resolve_model

    model = resolve_model(args.model)
    run_dir = Path(tempfile.mkdtemp(prefix="folio-chaos-"))
    cluster = Cluster(run_dir, model)
    soak = Soak(cluster, args)
    started = time.monotonic()
    phases: dict[str, float] = {}
    try:
        cluster.wait_serving(180)
        phases["start_s"] = time.monotonic() - started
        soak.make_references()
        phases["references_s"] = time.monotonic() - started - sum(phases.values())
        asyncio.run(soak.run(seconds))
        phases["load_s"] = time.monotonic() - started - sum(phases.values())
        cluster.wait_serving(120)
        idle = soak.idle_stats()
        # After the chaos the same prompts must still give the same answers.
        soak.until = time.monotonic() + 3600
        after = Counter()

        async def check_after() -> None:
            async with AsyncClient(cluster.clients[1], connect_timeout=10) as client:
                for index in range(len(soak.prompts)):
                    after[await soak.sdk_generate(client, index)] += 1
        asyncio.run(check_after())
        phases["checks_s"] = time.monotonic() - started - sum(phases.values())
    finally:
        cluster.close()
    leaked = (idle.get("kv_blocks_total", -1) - idle.get("kv_blocks_free", 0)
              if idle else None)
    summary = {
        "seconds": round(seconds), "wall_s": round(time.monotonic() - started),
        "phases": {name: round(value, 1) for name, value in phases.items()},
        "clients": args.clients, "requests": sum(soak.outcomes.values()),
        "outcomes": dict(soak.outcomes),
        "by_kind": {kind: dict(counts) for kind, counts in sorted(soak.by_kind.items())},
        "faults": dict(soak.faults),
        "recovery_s": {"max": round(max(soak.recoveries), 2),
                       "mean": round(sum(soak.recoveries) / len(soak.recoveries), 2)}
        if soak.recoveries else {},
        "leaked_blocks": leaked, "idle_stats": {k: idle.get(k) for k in (
            "kv_blocks_total", "kv_blocks_free", "num_running", "num_waiting")},
        "after_chaos": dict(after), "rss": soak.rss_growth(), "problems": soak.problems,
        "logs": str(run_dir)}
    bad = (soak.outcomes["wrong"] + soak.outcomes["double"] + soak.outcomes["hung"]
           + len(soak.problems) + after["wrong"] + after["error"])
    rss_ok = all(v["growth_mib"] < args.rss_slack_mib for v in summary["rss"].values())
    summary["passed"] = bad == 0 and leaked == 0 and rss_ok
    text = json.dumps(summary, indent=2)
    print(text)
    if args.out:
        Path(args.out).write_text(text + "\n")
    return 0 if summary["passed"] else 1


if __name__ == "__main__":
    sys.exit(main())
