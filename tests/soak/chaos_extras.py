"""The chaos soak's extras (tests/soak/chaos.py, SoakSettings.extras): what the last waves
added, under the same faults.

- LoRA adapters loaded at run time over HTTP (two, on an executor started with
  --enable-lora), unloaded and loaded again every few seconds, and requests naming them,
  judged against their greedy answers: executor restarts must bring them back (the
  scheduler re-registers them) with the same answers; a request for one that is away is a
  clear error.
- Requests with priorities 0-3 under --scheduling-policy priority, judged like the others.
- KV-event subscribers that come and go: each connects, replays from sequence 0 (the
  sequences must come back in order, without a gap) and reads a few live batches.

A request outcome is `ok`, `error` (a clear error) or `wrong`; anything else the loops see
(a load answered 500, a replay out of order) is a problem."""

from __future__ import annotations

import asyncio
import json
import random
import time

import httpx
import zmq
import zmq.asyncio

from tests.http_server import free_port

ADAPTERS = ("soak-a", "soak-b")
TOPIC = "kv-events"


def extras_args(run_dir) -> dict[str, tuple[str, ...]]:
    """The cluster's extra flags: engine (executor), scheduler and HTTP frontend."""
    events = {"enable_kv_cache_events": True, "publisher": "zmq",
              "endpoint": f"tcp://127.0.0.1:{free_port()}",
              "replay_endpoint": f"tcp://127.0.0.1:{free_port()}", "topic": TOPIC}
    policy = ("--max-loras", "2", "--scheduling-policy", "priority")
    return {"engine": ("--enable-lora", "--max-cpu-loras", "4", "--max-loras", "2"),
            "scheduler": (*policy, "--kv-events-config", json.dumps(events)),
            "http": ("--enable-lora-runtime-updates",)}


def make_adapters(model_dir, out_dir) -> dict[str, str]:
    from tests.lora_adapters import make_adapter

    return {name: str(make_adapter(model_dir, out_dir / name, seed=7 + i, rank=4))
            for i, name in enumerate(ADAPTERS)}


class Extras:
    def __init__(self, soak, adapters: dict[str, str], events: dict) -> None:
        self.soak, self.adapters, self.events = soak, adapters, events
        self.rng = random.Random(soak.settings.seed + 1)
        self.answers: dict[tuple[str, int], str] = {}   # (adapter, prompt) -> text
        self.counts = {"loads": 0, "unloads": 0, "refused": 0, "subscribers": 0,
                       "replayed": 0}

    # ---- setup and the end ----------------------------------------------------------

    async def load_all(self, http: httpx.AsyncClient) -> None:
        for name, path in self.adapters.items():
            answer = await http.post("/v1/load_lora_adapter",
                                     json={"lora_name": name, "lora_path": path})
            if answer.status_code != 200 and "already loaded" not in answer.text:
                raise RuntimeError(f"could not load {name}: {answer.text}")

    async def make_references(self, http: httpx.AsyncClient) -> None:
        await self.load_all(http)
        for name in self.adapters:
            for index in range(min(4, len(self.soak.prompts))):
                text = await self._complete(http, index, {"model": name})
                if text is None:
                    raise RuntimeError(f"no reference answer with adapter {name}")
                self.answers[(name, index)] = text

    async def answers_after(self, http: httpx.AsyncClient) -> dict[str, int]:
        """Every adapter (loaded again where it was away) gives its references once more."""
        await self.load_all(http)
        after = {"ok": 0, "wrong": 0, "error": 0}
        for (name, index), text in self.answers.items():
            got = await self._complete(http, index, {"model": name})
            after["error" if got is None else "ok" if got == text else "wrong"] += 1
        return after

    # ---- requests ---------------------------------------------------------------------

    async def _complete(self, http: httpx.AsyncClient, index: int, extra: dict) -> str | None:
        prompt, max_tokens = self.soak.prompts[index]
        answer = await http.post("/v1/completions", json={
            "prompt": prompt, "max_tokens": max_tokens, "temperature": 0,
            "ignore_eos": True, **extra})
        if answer.status_code != 200:
            if "error" not in answer.json():
                raise ValueError(f"HTTP {answer.status_code} without an error envelope")
            return None
        return answer.json()["choices"][0]["text"]

    async def http_lora(self, http: httpx.AsyncClient) -> str:
        name, index = self.rng.choice(sorted(self.answers))
        try:
            text = await self._complete(http, index, {"model": name})
        except httpx.HTTPError:
            return "error"
        return "error" if text is None else "ok" if text == self.answers[(name, index)] \
            else "wrong"

    async def http_priority(self, http: httpx.AsyncClient, index: int) -> str:
        try:
            text = await self._complete(http, index, {"priority": self.rng.randint(0, 3)})
        except httpx.HTTPError:
            return "error"
        return "error" if text is None else "ok" if text == self.soak.answers[index][1] \
            else "wrong"

    # ---- the loops beside the load ----------------------------------------------------

    async def adapter_loop(self, http: httpx.AsyncClient) -> None:
        """Unload an adapter and load it again, every 1-4 s."""
        while time.monotonic() < self.soak.until:
            await asyncio.sleep(self.rng.uniform(1.0, 4.0))
            name = self.rng.choice(ADAPTERS)
            try:
                gone = await http.post("/v1/unload_lora_adapter", json={"lora_name": name})
                back = await http.post("/v1/load_lora_adapter", json={
                    "lora_name": name, "lora_path": self.adapters[name]})
            except httpx.HTTPError:
                continue   # the HTTP frontend is stopped: the next round
            for answer, what in ((gone, "unloads"), (back, "loads")):
                if answer.status_code == 200:
                    self.counts[what] += 1
                elif answer.status_code in (400, 404, 503) and "error" in answer.json():
                    self.counts["refused"] += 1   # busy, away, or the engine restarting
                else:
                    self.soak.problems.append(f"{what}: HTTP {answer.status_code}: "
                                              f"{answer.text[:200]}")

    async def subscriber_loop(self) -> None:
        """KV-event subscribers that come and go, every 0.5-2 s."""
        ctx = zmq.asyncio.Context()
        try:
            while time.monotonic() < self.soak.until:
                await asyncio.sleep(self.rng.uniform(0.5, 2.0))
                await self._one_subscriber(ctx)
        finally:
            ctx.destroy(0)

    async def _one_subscriber(self, ctx) -> None:
        sub = ctx.socket(zmq.SUB)
        sub.setsockopt_string(zmq.SUBSCRIBE, TOPIC)
        replay = ctx.socket(zmq.DEALER)
        try:
            sub.connect(self.events["endpoint"])
            replay.connect(self.events["replay_endpoint"])
            await replay.send_multipart((b"", (0).to_bytes(8, "big")))
            seen: list[int] = []
            while await replay.poll(5000):
                _, seq, payload = await replay.recv_multipart()
                if not payload:
                    break
                seen.append(int.from_bytes(seq, "big"))
            if seen and seen != list(range(seen[0], seen[0] + len(seen))):
                self.soak.problems.append(f"a replay out of order: {seen[:20]}")
            self.counts["subscribers"] += 1
            self.counts["replayed"] += len(seen)
            for _ in range(self.rng.randint(0, 3)):   # a few live batches, if any come
                if not await sub.poll(200):
                    break
                await sub.recv_multipart()
        finally:
            sub.close(0)
            replay.close(0)
