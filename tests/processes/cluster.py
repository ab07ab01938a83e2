"""The reliability tests' cluster: real processes (scheduler, executor, two frontends, the
first with the HTTP API) on ipc:// sockets, with a small KV pool (64 blocks of 16 tokens) and
a waiting queue of 100, restartable as started; tests/processes/conftest.py holds its
fixtures. After each test every process must be alive (or back), a normal request must give
the right greedy output, and every KV block must be free."""

from __future__ import annotations

import asyncio
import os
import random
import signal
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import httpx

from folio import SamplingParams
from folio.client import AsyncClient, Client
from folio.errors import FolioError, QueueFull
from tests.http_server import free_port
from tests.pipeline import Pipeline, spawn_role

NUM_KV_BLOCKS = 64
MAX_QUEUED = 100
SCHEDULER_ARGS = ("--max-queued-requests", str(MAX_QUEUED))
GREEDY = dict(temperature=0, ignore_eos=True)
PROBE_PROMPT = [11, 22, 33, 44, 55]


class Cluster(Pipeline):
    """The pipeline of tests/pipeline.py, with every process restartable as it was started."""

    def __init__(self, run_dir, model_dir, num_kv_blocks: int = NUM_KV_BLOCKS,
                 extra: dict[str, tuple[str, ...]] | None = None) -> None:
        """extra: more flags for the "engine" (executor), "scheduler" and "http" frontend."""
        extra = extra or {}
        self.scheduler_args = (*SCHEDULER_ARGS, *extra.get("scheduler", ()))
        self.http_args = extra.get("http", ())
        super().__init__(run_dir, model_dir, num_frontends=2,
                         engine_args=("--num-kv-blocks", str(num_kv_blocks),
                                      *extra.get("engine", ())),
                         scheduler_args=self.scheduler_args, http_port=free_port(),
                         http_args=self.http_args)
        self.num_kv_blocks = num_kv_blocks
        self.base = f"http://127.0.0.1:{self.http_port}"
        self.reference: list[int] | None = None   # greedy output of PROBE_PROMPT

    def start(self, name: str) -> None:
        if name == "executor":
            self.start_executor()
        elif name == "scheduler":
            self.procs["scheduler"] = spawn_role(
                ["scheduler", "--frontend-address", self.frontend_address,
                 "--executor-address", self.executor_address, *self.scheduler_args],
                self.run_dir / "scheduler.log")
        else:
            index = int(name.removeprefix("frontend"))
            http = ["--port", str(self.http_port), *self.http_args] if index == 0 else []
            self.procs[name] = spawn_role(
                ["frontend", "--model", str(self.model_dir), "--client-address",
                 self.client_addresses[index], "--scheduler-address", self.frontend_address,
                 *http], self.run_dir / f"{name}.log")

    def signal(self, name: str, sig: int) -> None:
        os.kill(self.procs[name].pid, sig)
        if sig == signal.SIGKILL:
            self.procs[name].wait(timeout=10)

    def heal(self) -> None:
        """Whatever an earlier test left behind: continue stopped processes, restart dead
        ones, and wait until both frontends and the HTTP API serve."""
        for name, proc in list(self.procs.items()):
            if proc.poll() is None:
                os.kill(proc.pid, signal.SIGCONT)
            else:
                self.start(name)
        for restart in ((), ("executor",), tuple(self.procs)):
            for name in restart:   # still not serving: start these afresh
                if self.procs[name].poll() is None:
                    self.signal(name, signal.SIGKILL)
                self.start(name)
            try:
                self.wait_ready(timeout=30 if restart else 25)
            except TimeoutError:
                continue
            if wait_http_health(self.base, 200, timeout=30) == 200:
                return
        raise RuntimeError(f"the cluster could not be healed; logs: {self.logs()}")

    def stats(self, frontend: int = 0) -> dict:
        with Client(self.client_addresses[frontend], connect_timeout=5) as client:
            return client.health()["stats"]

    def wait_idle(self, frontend: int = 0, timeout: float = 15.0) -> dict:
        """Stats once nothing runs or waits and every block is free (or at the timeout)."""
        deadline = time.monotonic() + timeout
        with Client(self.client_addresses[frontend], connect_timeout=5) as client:
            while True:
                stats = client.health()["stats"]
                if (stats.get("kv_blocks_free") == stats.get("kv_blocks_total")
                        and stats.get("num_running") == stats.get("num_waiting") == 0):
                    return stats
                if time.monotonic() > deadline:
                    return stats
                time.sleep(0.05)

    def assert_serving(self, frontend: int = 0) -> None:
        """A normal request gives the right greedy output and every block is free."""
        self.check_alive()
        with Client(self.client_addresses[frontend], connect_timeout=5) as client:
            result = client.generate(PROBE_PROMPT, SamplingParams(max_tokens=8, **GREEDY),
                                     timeout=30)
        assert result.token_ids == self.reference
        stats = self.wait_idle(frontend)
        assert stats["kv_blocks_free"] == stats["kv_blocks_total"] == self.num_kv_blocks, stats


def wait_http_health(base: str, status: int, timeout: float) -> int:
    deadline = time.monotonic() + timeout
    code = -1
    while time.monotonic() < deadline:
        try:
            code = httpx.get(f"{base}/health", timeout=2).status_code
        except httpx.HTTPError:
            code = -1
        if code == status:
            return code
        time.sleep(0.1)
    return code


def running_cluster(tmp_path_factory, model_dir, num_kv_blocks: int = NUM_KV_BLOCKS,
                    extra: dict[str, tuple[str, ...]] | None = None):
    yield from serving_cluster(tmp_path_factory.mktemp("reliability"), model_dir,
                               num_kv_blocks, extra)


def serving_cluster(run_dir, model_dir, num_kv_blocks: int = NUM_KV_BLOCKS,
                    extra: dict[str, tuple[str, ...]] | None = None):
    """A ready cluster for the block, stopped after it (its generator)."""
    pipe = Cluster(run_dir, model_dir, num_kv_blocks, extra)
    try:
        pipe.wait_ready()
        wait_http_health(pipe.base, 200, timeout=30)
        with Client(pipe.client_addresses[0]) as client:
            pipe.reference = client.generate(PROBE_PROMPT,
                                             SamplingParams(max_tokens=8, **GREEDY)).token_ids
        yield pipe
    finally:
        for proc in pipe.procs.values():   # a stopped process cannot take SIGTERM
            if proc.poll() is None:
                os.kill(proc.pid, signal.SIGCONT)
        pipe.stop()


ENDLESS = 20_000   # tokens: outlasts any step of a test on a far faster engine


def random_prompt(rng: random.Random, low: int, high: int) -> list[int]:
    return [rng.randrange(1, 1024) for _ in range(rng.randint(low, high))]


LONG = 300


async def sdk_stream(client: AsyncClient, started: asyncio.Event, max_tokens: int = LONG
                      ) -> int:
    """Tokens of a long SDK stream (raises what the SDK raises); sets `started` at the first."""
    count = 0
    async for delta in client.stream([7] * 20, SamplingParams(max_tokens=max_tokens, **GREEDY),
                                     timeout=30):
        count += len(delta.token_ids)
        started.set()
    return count


async def value_or_error(awaitable):
    """What a call returned, or the Folio error it raised (tests assert on either)."""
    try:
        return await awaitable
    except FolioError as error:
        return error


@asynccontextmanager
async def queue_kept_full(client: AsyncClient, timeout: float) -> AsyncIterator[None]:
    """The cluster's waiting queue kept full by SDK requests (200-token answers, `timeout`
    each) for the length of the block, entered once one of them was refused as queue full;
    on leaving, the flood is aborted (the SDK aborts what it cancels)."""
    params = SamplingParams(max_tokens=200, **GREEDY)
    flood: list[asyncio.Task] = []
    stop = asyncio.Event()

    async def keep_full():
        while not stop.is_set() and len(flood) < 3000:
            flood.extend(asyncio.create_task(client.generate([7] * 30, params,
                                                             timeout=timeout))
                         for _ in range(25))
            await asyncio.sleep(0.05)

    topper = asyncio.create_task(keep_full())
    try:
        deadline = time.monotonic() + 20
        while not any(t.done() and isinstance(t.exception(), QueueFull)
                      for t in flood if not t.cancelled()):
            assert time.monotonic() < deadline, "the queue never filled"
            await asyncio.sleep(0.05)
        yield
    finally:
        stop.set()
        await topper
        for task in flood:
            task.cancel()
        await asyncio.gather(*flood, return_exceptions=True)
