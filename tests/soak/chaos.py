"""Chaos soak: mixed load on the reliability cluster (tests/processes/cluster.py: a scheduler,
an executor and two frontends, the first with the HTTP API) while its processes are killed
and stopped at random.

`settings.clients` concurrent loops send mixed requests: SDK generate and streams, SDK
streams left early (aborts), HTTP completions with n = 2, HTTP streams, HTTP streams whose
client vanishes mid-stream, and SDK clients that send a request and vanish. Meanwhile a
chaos loop, every few seconds, does one of: SIGKILL the executor (restarted), SIGSTOP it for
1-3 s, SIGKILL or SIGSTOP the SDK-only frontend, SIGSTOP the HTTP frontend, SIGSTOP or
(rarely) SIGKILL the scheduler (restarted).

Every prompt is greedy with a known answer (computed before the chaos starts), so each
request is judged: `ok` (the exact answer), `error` (a clear error: a Folio exception, an
HTTP status with the error envelope, an SSE error event), `wrong` (any other output: mixed
up, duplicated, cut), `double` (anything after its end: a second final, events after an
error or after [DONE]) or `hung` (no end within the request timeout). Requests abandoned on
purpose count as `left`. At the end, with the load stopped and the processes healed, every
KV block must be free and nothing running, and the same prompts must give the same answers;
the HTTP frontend's and scheduler's RSS are sampled every 2 s (the HTTP frontend is never
killed, so its RSS spans the run).

With `extras` (tests/soak/chaos_extras.py): runtime LoRA adapters loaded, unloaded and used
(and re-registered after executor restarts), requests with priorities, and KV-event
subscribers that come and go. The command line runs it on a fresh cluster:

    python -m tests.soak.chaos --seconds 600 --clients 12 --extras
"""

from __future__ import annotations

import asyncio
import json
import random
import signal
import time
from collections import Counter
from dataclasses import dataclass

import httpx
import zmq

from folio import SamplingParams
from folio.client import AsyncClient
from folio.errors import FolioError
from folio.shared.protocol import messages as m
from tests.processes.cluster import GREEDY, Cluster, wait_http_health
from tests.soak.chaos_extras import Extras
from tests.soak.memory import rss_mib

# (action, process, weight): the HTTP frontend is only stopped, so its RSS spans the run.
FAULTS = (("kill", "executor", 4), ("stop", "executor", 3), ("kill", "frontend1", 2),
          ("stop", "frontend1", 2), ("stop", "frontend0", 1), ("stop", "scheduler", 2),
          ("kill", "scheduler", 1))
REQUEST_KINDS = ("sdk", "sdk_stream", "sdk_abort", "http_n2", "http_stream", "http_vanish",
                 "sdk_vanish")
EXTRA_KINDS = ("http_lora", "http_priority")


@dataclass(frozen=True)
class SoakSettings:
    seconds: float
    clients: int = 12                 # concurrent request loops
    prompts: int = 24                 # distinct greedy prompts
    vocab: int = 1000                 # prompt ids drawn below this
    fault_gap: float = 6.0            # seconds between faults, drawn from [gap/2, gap]
    faults: tuple[str, ...] = tuple(f"{action}-{name}" for action, name, _ in FAULTS)
    request_timeout: float = 60.0
    rss_slack_mib: float = 64.0
    seed: int = 0
    extras: bool = False              # adapters, priorities, KV-event subscribers


class Soak:
    def __init__(self, cluster: Cluster, settings: SoakSettings) -> None:
        self.cluster, self.settings = cluster, settings
        self.rng = random.Random(settings.seed)
        self.outcomes: Counter = Counter()
        self.by_kind: dict[str, Counter] = {}
        self.problems: list[str] = []
        self.faults: Counter = Counter()
        self.recoveries: list[float] = []
        self.stopped: set[str] = set()
        self.rss: dict[str, list[tuple[int, float]]] = {}   # name -> (pid, MiB)
        self.prompts: list[tuple[list[int], int]] = []
        self.answers: dict[int, tuple[list[int], str]] = {}   # prompt index -> ids, text
        self.until = 0.0
        self.extras = None   # chaos_extras.Extras, when settings.extras
        self.kinds = REQUEST_KINDS + (EXTRA_KINDS if settings.extras else ())

    # ---- references -----------------------------------------------------------------

    async def make_references(self) -> None:
        for _ in range(self.settings.prompts):
            prompt = [self.rng.randrange(3, self.settings.vocab)
                      for _ in range(self.rng.randint(4, 40))]
            self.prompts.append((prompt, self.rng.randint(8, 48)))
        # together: one batch, not one request at a time
        async with AsyncClient(self.cluster.client_addresses[0], connect_timeout=10) as client:
            done = await asyncio.gather(*(client.generate(
                prompt, SamplingParams(max_tokens=max_tokens, **GREEDY), timeout=120)
                for prompt, max_tokens in self.prompts))
        for index, completion in enumerate(done):
            self.answers[index] = (completion.token_ids, completion.text)
        if self.extras is not None:
            async with httpx.AsyncClient(base_url=self.cluster.base, timeout=120) as http:
                await self.extras.make_references(http)

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
                                         timeout=self.settings.request_timeout)
        except FolioError:
            return "error"
        return "ok" if done.token_ids == self.answers[index][0] else "wrong"

    async def sdk_stream(self, client: AsyncClient, index: int, leave_after: int | None) -> str:
        prompt, max_tokens = self.prompts[index]
        ids: list[int] = []
        try:
            async for delta in client.stream(prompt, SamplingParams(max_tokens=max_tokens,
                                                                    **GREEDY),
                                             timeout=self.settings.request_timeout):
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
        prompt, max_tokens = self.prompts[index]
        ctx = zmq.Context()
        sock = ctx.socket(zmq.DEALER)
        sock.setsockopt(zmq.LINGER, 200)
        try:
            sock.connect(self.rng.choice(self.cluster.client_addresses))
            sock.send(m.encode_generate(f"vanish-{self.rng.random()}", SamplingParams(
                max_tokens=max_tokens, **GREEDY), True, prompt_token_ids=prompt))
            await asyncio.sleep(self.rng.uniform(0.05, 0.5))   # a client's lifetime
        finally:
            sock.close()
            ctx.term()
        return "left"

    def _work(self, kind: str, index: int, sdk: list[AsyncClient], http: httpx.AsyncClient):
        client = self.rng.choice(sdk)
        if kind == "sdk":
            return self.sdk_generate(client, index)
        if kind in ("sdk_stream", "sdk_abort"):
            return self.sdk_stream(client, index,
                                   self.rng.randint(1, 6) if kind == "sdk_abort" else None)
        if kind == "http_n2":
            return self.http_n2(http, index)
        if kind == "sdk_vanish":
            return self.sdk_vanish(index)
        if kind == "http_lora":
            return self.extras.http_lora(http)
        if kind == "http_priority":
            return self.extras.http_priority(http, index)
        return self.http_stream(http, index, kind == "http_vanish")

    async def one_request(self, sdk: list[AsyncClient], http: httpx.AsyncClient) -> None:
        index = self.rng.randrange(len(self.prompts))
        kind = self.rng.choice(self.kinds)
        try:
            outcome = await asyncio.wait_for(self._work(kind, index, sdk, http),
                                             self.settings.request_timeout + 30)
        except asyncio.TimeoutError:
            outcome = "hung"
        except Exception as error:   # a crash of the soak itself is a finding too
            outcome, kind = "wrong", f"{kind} ({type(error).__name__}: {error})"
        self.record(kind, outcome, f"prompt {index}")
        if outcome == "error":   # the engine is down or recovering: back off a little
            await asyncio.sleep(self.rng.uniform(0.1, 0.4))

    async def worker(self) -> None:
        sdk = [AsyncClient(address, connect_timeout=5)
               for address in self.cluster.client_addresses]
        async with httpx.AsyncClient(base_url=self.cluster.base, timeout=httpx.Timeout(
                self.settings.request_timeout, connect=5)) as http:
            try:
                while time.monotonic() < self.until:
                    await self.one_request(sdk, http)
            finally:
                for client in sdk:
                    await client.close()

    # ---- chaos and sampling -------------------------------------------------------------

    def wait_serving(self, timeout: float) -> float:
        """Seconds until both frontends and the HTTP API serve again."""
        start = time.monotonic()
        self.cluster.wait_ready(timeout)
        left = timeout - (time.monotonic() - start)
        if wait_http_health(self.cluster.base, 200, max(left, 1.0)) != 200:
            raise TimeoutError(f"no HTTP /health 200 within {timeout:.0f} s")
        return time.monotonic() - start

    async def strike(self, action: str, name: str) -> None:
        """One fault, over once the process is back (restarted) or continued."""
        if action == "kill":
            self.cluster.signal(name, signal.SIGKILL)
            await asyncio.sleep(self.rng.uniform(0.2, 1.0))   # how long it stays dead
            self.cluster.start(name)
        else:
            self.cluster.signal(name, signal.SIGSTOP)
            self.stopped.add(name)
            await asyncio.sleep(self.rng.uniform(1.0, 3.0))   # how long it stays stopped
            self.cluster.signal(name, signal.SIGCONT)
            self.stopped.discard(name)

    async def chaos(self) -> None:
        choices = [(action, name) for action, name, weight in FAULTS for _ in range(weight)
                   if f"{action}-{name}" in self.settings.faults]
        span = self.until - time.monotonic()   # a short run still gets its faults
        await asyncio.sleep(min(self.rng.uniform(2, 4), 0.15 * span))
        while time.monotonic() < self.until - min(3.0, 0.25 * span):
            action, name = self.rng.choice(choices)
            self.faults[f"{action} {name}"] += 1
            await self.strike(action, name)
            try:
                self.recoveries.append(await asyncio.to_thread(self.wait_serving, 60))
            except (TimeoutError, RuntimeError) as error:
                self.problems.append(f"no recovery after {action} {name}: {error}"[:400])
                return
            await asyncio.sleep(self.rng.uniform(self.settings.fault_gap / 2,
                                                 self.settings.fault_gap))

    async def sample_rss(self) -> None:
        while time.monotonic() < self.until:
            for name in ("frontend0", "scheduler"):
                pid = self.cluster.procs[name].pid
                rss = rss_mib(pid)
                if rss is not None and name not in self.stopped:
                    self.rss.setdefault(name, []).append((pid, rss))
            await asyncio.sleep(2)   # the sampling period

    async def load(self) -> None:
        self.until = time.monotonic() + self.settings.seconds
        loops = []
        if self.extras is not None:
            http = httpx.AsyncClient(base_url=self.cluster.base, timeout=httpx.Timeout(
                self.settings.request_timeout, connect=5))
            loops = [self.extras.adapter_loop(http), self.extras.subscriber_loop()]
        try:
            await asyncio.gather(self.chaos(), self.sample_rss(), *loops,
                                 *(self.worker() for _ in range(self.settings.clients)))
        finally:
            if loops:
                await http.aclose()

    # ---- the verdict ----------------------------------------------------------------------

    def rss_growth(self) -> dict:
        """Per process: MiB from the median of the first samples of its longest-lived
        incarnation to the median of its last ones."""
        growth = {}
        for name, samples in self.rss.items():
            by_pid: dict[int, list[float]] = {}
            for pid, rss in samples:
                by_pid.setdefault(pid, []).append(rss)
            longest = max(by_pid.values(), key=len)
            if len(longest) < 4:
                continue
            k = max(2, len(longest) // 5)
            first, last = sorted(longest[:k])[k // 2], sorted(longest[-k:])[k // 2]
            growth[name] = {"samples": len(longest), "first_mib": round(first, 1),
                            "last_mib": round(last, 1), "growth_mib": round(last - first, 1)}
        return growth

    async def answers_after(self) -> Counter:
        """Each prompt once more, through the frontend that chaos killed and stopped most."""
        after = Counter()
        self.until = time.monotonic() + 3600
        async with AsyncClient(self.cluster.client_addresses[1], connect_timeout=10) as client:
            for index in range(len(self.prompts)):
                after[await self.sdk_generate(client, index)] += 1
        return after


def run_soak(cluster: Cluster, settings: SoakSettings, extras: dict | None = None) -> dict:
    """The soak on a serving cluster; its summary, with `passed`: nothing wrong, doubled or
    hung, no block leaked, the same answers after, and the RSS grown by less than the slack.
    `extras`: {"adapters": name -> path, "events": the KV-events config} with
    settings.extras (the cluster started with chaos_extras.extras_args)."""
    soak = Soak(cluster, settings)
    if settings.extras:
        soak.extras = Extras(soak, extras["adapters"], extras["events"])
    started = time.monotonic()
    asyncio.run(soak.make_references())
    asyncio.run(soak.load())
    soak.wait_serving(120)
    idle = cluster.wait_idle(timeout=60)
    after = asyncio.run(soak.answers_after())
    adapters_after = asyncio.run(_extras_after(soak)) if soak.extras is not None else {}
    leaked = idle.get("kv_blocks_total", -1) - idle.get("kv_blocks_free", 0)
    summary = {
        "seconds": settings.seconds, "wall_s": round(time.monotonic() - started),
        "clients": settings.clients, "requests": sum(soak.outcomes.values()),
        "outcomes": dict(soak.outcomes),
        "by_kind": {kind: dict(counts) for kind, counts in sorted(soak.by_kind.items())},
        "faults": dict(soak.faults),
        "recovery_s": {"max": round(max(soak.recoveries), 2),
                       "mean": round(sum(soak.recoveries) / len(soak.recoveries), 2)}
        if soak.recoveries else {},
        "leaked_blocks": leaked, "idle_stats": {k: idle.get(k) for k in (
            "kv_blocks_total", "kv_blocks_free", "num_running", "num_waiting")},
        "after_chaos": dict(after), "rss": soak.rss_growth(), "problems": soak.problems,
        "extras": {**soak.extras.counts, "adapters_after": adapters_after}
        if soak.extras is not None else {},
        "logs": str(cluster.run_dir)}
    bad = (soak.outcomes["wrong"] + soak.outcomes["double"] + soak.outcomes["hung"]
           + len(soak.problems) + after["wrong"] + after["error"]
           + adapters_after.get("wrong", 0) + adapters_after.get("error", 0))
    rss_ok = all(v["growth_mib"] < settings.rss_slack_mib for v in summary["rss"].values())
    summary["passed"] = bad == 0 and leaked == 0 and rss_ok
    return summary


async def _extras_after(soak: Soak) -> dict[str, int]:
    async with httpx.AsyncClient(base_url=soak.cluster.base, timeout=120) as http:
        return await soak.extras.answers_after(http)


def main() -> int:
    """A soak on a fresh cluster of the tiny test model (made here), printing its summary."""
    import argparse
    import tempfile
    from pathlib import Path

    from folio.tiny_models import make_tiny_model_dir
    from tests.processes.cluster import serving_cluster
    from tests.soak.chaos_extras import extras_args, make_adapters

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seconds", type=float, default=60)
    parser.add_argument("--clients", type=int, default=12)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--extras", action="store_true",
                        help="adapters, priorities and KV-event subscribers too")
    parser.add_argument("--num-kv-blocks", type=int, default=256)
    args = parser.parse_args()
    root = Path(tempfile.mkdtemp(prefix="folio-chaos-"))
    model = make_tiny_model_dir(root / "model")
    extra = extras_args(root) if args.extras else None
    setup = None
    if args.extras:
        events = json.loads(extra["scheduler"][extra["scheduler"].index("--kv-events-config")
                                               + 1])
        setup = {"adapters": make_adapters(model, root / "adapters"), "events": events}
    run_dir = root / "cluster"
    run_dir.mkdir()
    cluster_gen = serving_cluster(run_dir, model, args.num_kv_blocks, extra)
    cluster = next(cluster_gen)
    try:
        summary = run_soak(cluster, SoakSettings(seconds=args.seconds, clients=args.clients,
                                                 seed=args.seed, extras=args.extras), setup)
    finally:
        cluster_gen.close()
    print(json.dumps(summary, indent=1))
    return 0 if summary["passed"] else 1


if __name__ == "__main__":
    raise SystemExit(main())
