"""Reliability under load, faults and bad input (issue 9): nothing lost, nothing leaked,
nothing hangs.

One set of real processes (scheduler, executor, two frontends, the first with the HTTP API)
on ipc:// sockets, with a small KV pool (64 blocks of 16 tokens) and a waiting queue of 100.
The tests flood it, make clients vanish, fuzz every bound ZeroMQ socket and the HTTP API,
and kill or stop each process; after each, every process must be alive (or back), a normal
request must give the right greedy output, and every KV block must be free.
"""

from __future__ import annotations

import asyncio
import json
import os
import random
import signal
import subprocess
import sys
import time
import uuid

import httpx
import msgpack
import pytest
import zmq
import zmq.asyncio

from folio import SamplingParams
from folio.client import AsyncClient, Client, Completion
from folio.errors import EngineDead, FolioError, QueueFull, ServerUnreachable
from folio.shared import messages as m
from folio.shared.config import ExecutorCapacity
from folio.shared.outputs import EngineOutput
from folio.shared.step import StepResult
from folio.shared.wire import PROTOCOL_VERSION
from tests.http_server import free_port
from tests.pipeline import Pipeline, spawn_role, start_streams

pytestmark = pytest.mark.slow

NUM_KV_BLOCKS = 64
MAX_QUEUED = 100
SCHEDULER_ARGS = ("--max-queued-requests", str(MAX_QUEUED))
GREEDY = dict(temperature=0, ignore_eos=True)
PROBE_PROMPT = [11, 22, 33, 44, 55]


class Cluster(Pipeline):
    """The pipeline of tests/pipeline.py, with every process restartable as it was started."""

    def __init__(self, run_dir, model_dir, num_kv_blocks: int = NUM_KV_BLOCKS) -> None:
        super().__init__(run_dir, model_dir, num_frontends=2,
                         engine_args=("--num-kv-blocks", str(num_kv_blocks)),
                         scheduler_args=SCHEDULER_ARGS, http_port=free_port())
        self.num_kv_blocks = num_kv_blocks
        self.base = f"http://127.0.0.1:{self.http_port}"
        self.reference: list[int] | None = None   # greedy output of PROBE_PROMPT

    def start(self, name: str) -> None:
        if name == "executor":
            self.start_executor()
        elif name == "scheduler":
            self.procs["scheduler"] = spawn_role(
                ["scheduler", "--frontend-address", self.frontend_address,
                 "--executor-address", self.executor_address, *SCHEDULER_ARGS],
                self.run_dir / "scheduler.log")
        else:
            index = int(name.removeprefix("frontend"))
            http = ["--port", str(self.http_port)] if index == 0 else []
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


def _cluster(tmp_path_factory, model_dir, num_kv_blocks: int = NUM_KV_BLOCKS):
    pipe = Cluster(tmp_path_factory.mktemp("reliability"), model_dir, num_kv_blocks)
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


@pytest.fixture(scope="module")
def cluster(tmp_path_factory, llama_dir):
    yield from _cluster(tmp_path_factory, llama_dir)


ENDLESS = 20_000   # tokens: outlasts any step of a test on a far faster engine


@pytest.fixture
def long_cluster(tmp_path_factory, long_llama_dir):
    """The same processes on a 32768-token model with room for three ENDLESS answers, for a
    test whose requests must run on for as long as the test takes to look (its own: the
    test stops one of them)."""
    yield from _cluster(tmp_path_factory, long_llama_dir, 4096)


@pytest.fixture
def healthy(cluster):
    cluster.heal()
    return cluster


def _random_prompt(rng: random.Random, low: int, high: int) -> list[int]:
    return [rng.randrange(1, 1024) for _ in range(rng.randint(low, high))]


# ---- overload ---------------------------------------------------------------------------------

def test_1000_concurrent_requests_complete_right_or_are_refused_queue_full(healthy):
    rng = random.Random(1)
    count = 1000
    prompts = [_random_prompt(rng, 1, 40) for _ in range(count)]
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
        async with AsyncClient(healthy.client_addresses[1]) as client:
            params = SamplingParams(max_tokens=200, **GREEDY)
            flood: list[asyncio.Task] = []
            stop = asyncio.Event()

            async def keep_full():
                while not stop.is_set() and len(flood) < 3000:
                    flood.extend(asyncio.create_task(client.generate([7] * 30, params,
                                                                     timeout=60))
                                 for _ in range(25))
                    await asyncio.sleep(0.05)

            topper = asyncio.create_task(keep_full())
            try:
                deadline = time.monotonic() + 20
                while not any(t.done() and isinstance(t.exception(), QueueFull)
                              for t in flood if not t.cancelled()):
                    assert time.monotonic() < deadline, "the queue never filled"
                    await asyncio.sleep(0.05)
                async with httpx.AsyncClient(base_url=healthy.base, timeout=30) as http:
                    return await asyncio.gather(*(stream_status(http) for _ in range(20)))
            finally:
                stop.set()
                await topper
                for task in flood:
                    task.cancel()   # the SDK aborts them
                await asyncio.gather(*flood, return_exceptions=True)

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
                for frames in _fuzz_messages("frontend-clients", 10_000, seed=5):
                    sock.send_multipart(frames)
                for i in range(20):
                    sock.send(m.pack("generate", {"id": f"big-{i}", "params": {},
                                                  "prompt_token_ids": [1] * 2**22}))
                # The frontend's first answer to the burst: it is working through it now.
                assert await asyncio.to_thread(sock.poll, BURST_WAIT_S * 1000), \
                    "no answer to the burst"
                during = await _value_or_error(client.generate(
                    PROBE_PROMPT, SamplingParams(max_tokens=8, **GREEDY), timeout=BURST_WAIT_S))
            finally:
                sock.close()
                ctx.term()
            if not job.done():   # still streaming, nothing failed it: end it (an abort)
                job.cancel()
                await asyncio.gather(job, return_exceptions=True)
                return "running", during
            return await _value_or_error(job), during

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


# ---- one user cannot hurt another ------------------------------------------------------------

LONG_STOPS = ["x" * 59_999 + chr(65 + i) for i in range(16)]   # 960 KB, every limit kept


async def _bystander(client: AsyncClient):
    return await _value_or_error(client.generate(
        PROBE_PROMPT, SamplingParams(max_tokens=8, **GREEDY), timeout=60))


async def _bystanders_while(client: AsyncClient, job: asyncio.Task) -> list:
    """Bystanders one after another for as long as `job` runs (at least one): some are
    served beside it at any engine speed, with no guess at how long it takes."""
    served = [await _bystander(client)]
    while not job.done() and len(served) < 1000:
        served.append(await _bystander(client))
    return served


def test_a_960_kb_stop_string_request_hurts_no_one(healthy):
    """64 prompts, n = 3, 16 stop strings of 60,000 characters: it is served, and a
    bystander's request beside it gets its normal answer (no plan grows with stop strings)."""
    executor = healthy.procs["executor"]
    body = {"prompt": [[3 + i] * 5 for i in range(64)], "n": 3, "max_tokens": 4,
            "stop": LONG_STOPS, **GREEDY}

    async def run():
        async with AsyncClient(healthy.client_addresses[1]) as client, \
                httpx.AsyncClient(base_url=healthy.base, timeout=120) as http:
            big = asyncio.create_task(http.post("/v1/completions", json=body))
            return await _bystanders_while(client, big), await big

    bystanders, response = asyncio.run(run())
    assert response.status_code == 200, response.text[:300]
    choices = response.json()["choices"]
    assert sorted(c["index"] for c in choices) == list(range(192))
    assert {c["finish_reason"] for c in choices} == {"length"}
    for bystander in bystanders:
        assert not isinstance(bystander, FolioError), bystander
        assert bystander.token_ids == healthy.reference
    assert executor.poll() is None and healthy.procs["executor"] is executor   # no restart
    healthy.assert_serving(0)


def test_a_stream_with_long_stop_strings_does_not_stall_a_bystander(healthy):
    """Matching 16 stop strings of 60,000 characters costs each token its own characters:
    the stream gives the same text as without them, and bystanders are served meanwhile."""
    request = {"prompt": [9] * 20, "max_tokens": 300, **GREEDY}

    async def run():
        async with AsyncClient(healthy.client_addresses[0]) as client, \
                httpx.AsyncClient(base_url=healthy.base, timeout=60) as http:
            plain = (await http.post("/v1/completions", json=request)).json()

            first = asyncio.Event()

            async def stream():
                texts = []
                async with http.stream("POST", "/v1/completions", json={
                        **request, "stream": True, "stop": LONG_STOPS}) as response:
                    async for line in response.aiter_lines():
                        if line.startswith("data: {"):
                            texts.append(json.loads(line[6:])["choices"][0])
                            first.set()
                return texts

            streaming = asyncio.create_task(stream())
            await asyncio.wait_for(first.wait(), 60)   # streaming: now the bystanders
            bystanders = [await _bystander(client) for _ in range(3)]
            return plain, await asyncio.wait_for(streaming, 60), bystanders

    plain, chunks, bystanders = asyncio.run(run())
    assert "".join(c["text"] for c in chunks) == plain["choices"][0]["text"]
    assert chunks[-1]["finish_reason"] == "length"
    for bystander in bystanders:
        assert not isinstance(bystander, FolioError), bystander
        assert bystander.token_ids == healthy.reference


def test_a_huge_chat_prompt_is_prepared_off_the_loop_while_others_are_served(long_cluster):
    """A chat of one 7.5 M-character message is templated and tokenized beside the event
    loop: a stream running meanwhile goes on unharmed, requests sent meanwhile are served,
    and the huge one is refused alone (longer than max_model_len). The stream is an ENDLESS
    one on a cluster of its own, so it still runs while the huge one is prepared at any
    engine speed; it is aborted at the end."""
    healthy = long_cluster

    async def run():
        async with AsyncClient(healthy.client_addresses[0]) as client:
            (running,) = await start_streams(client, [7] * 20, SamplingParams(
                max_tokens=ENDLESS, **GREEDY))
            huge = asyncio.create_task(_value_or_error(client.chat(
                [{"role": "user", "content": "The for statement. " * 390_000}],
                SamplingParams(max_tokens=4), timeout=120)))
            during = await _bystanders_while(client, huge)
            huge = await huge
            if running.done():   # an engine fast enough to finish it: it finished normally
                return await _value_or_error(running), during, huge
            running.cancel()   # still streaming, nothing failed it: end it (an abort)
            await asyncio.gather(running, return_exceptions=True)
            return "running", during, huge

    running, during, huge = asyncio.run(run())
    assert running == "running" or (running.finish_reason == "length" and
                                    len(running.token_ids) == ENDLESS), running
    for bystander in during:
        assert not isinstance(bystander, FolioError), bystander
        assert bystander.token_ids == healthy.reference
    assert isinstance(huge, FolioError) and "max_model_len" in str(huge), huge
    healthy.assert_serving(0)


# ---- clients that vanish ----------------------------------------------------------------------

def test_200_vanishing_clients_then_a_normal_request_promptly(healthy):
    rng = random.Random(2)
    kinds = ["raw"] * 70 + ["sdk"] * 60 + ["http"] * 70
    rng.shuffle(kinds)
    jobs = [(kind, _random_prompt(rng, 4, 40), rng.randint(300, 900), rng.uniform(0.05, 1.5))
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
        async with httpx.AsyncClient(base_url=healthy.base, timeout=30) as client:
            for wave in range(0, len(jobs), 50):
                await asyncio.gather(*(
                    raw(*job[1:]) if job[0] == "raw" else sdk(*job[1:]) if job[0] == "sdk"
                    else http(client, *job[1:]) for job in jobs[wave:wave + 50]))

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
            params = SamplingParams(max_tokens=200, **GREEDY)
            flood: list[asyncio.Task] = []
            stop = asyncio.Event()

            async def keep_full():
                while not stop.is_set() and len(flood) < 3000:
                    flood.extend(asyncio.create_task(client.generate([7] * 30, params,
                                                                     timeout=120))
                                 for _ in range(25))
                    await asyncio.sleep(0.05)

            topper = asyncio.create_task(keep_full())
            try:
                deadline = time.monotonic() + 20
                while not any(t.done() and isinstance(t.exception(), QueueFull)
                              for t in flood if not t.cancelled()):
                    assert time.monotonic() < deadline, "the queue never filled"
                    await asyncio.sleep(0.05)
                outcomes = [await attempt(http, stream) for stream in (True, False) * 3]
            finally:
                stop.set()
                await topper
                for task in flood:
                    task.cancel()   # the SDK aborts them
                await asyncio.gather(*flood, return_exceptions=True)
        return outcomes, await asyncio.to_thread(healthy.wait_idle, 0, 20.0)

    outcomes, stats = asyncio.run(run())
    assert any(o.endswith("queue_full") for o in outcomes), outcomes
    assert stats["num_running"] == stats["num_waiting"] == 0, (outcomes, stats)
    assert stats["kv_blocks_free"] == stats["kv_blocks_total"], (outcomes, stats)


# ---- ZeroMQ fuzz ------------------------------------------------------------------------------

BAD_VALUES = [None, True, False, 0, -1, 2**31, 2**63 - 1, 2**64 - 1, -2**63, 1.5,
              float("nan"), float("inf"), -1e308, "", "x", "é" * 300, b"\x00\xff", [], [1, 2],
              ["a"], [None], [[1]], [-5], {}, {"a": 1}, {"": None}]


def _valid_messages(socket: str) -> list[bytes]:
    """Real encodings from shared/messages.py, the ones this socket accepts."""
    params = SamplingParams(max_tokens=2, temperature=0)
    if socket == "scheduler-frontends":
        return [m.encode_add("fz-1", [1, 2, 3, 4], params), m.encode_abort("fz-1"),
                m.pack("stats_request", {}), m.pack("frontend_hello", {"id": "fe-fuzz"}),
                m.encode_heartbeat(1)]
    if socket == "scheduler-executor":
        capacity = ExecutorCapacity(num_kv_blocks=64, block_size=16, max_model_len=1024,
                                    vocab_size=1024, eos_token_ids=(0,))
        result = StepResult(step_id=3, handles=[0, 1], token_ids=[5, 6])
        result.logprobs = [(-0.5, 1, [5, 7], [-0.5, -1.0]), None]
        return [m.encode_result(result), m.encode_executor_error(3, "RuntimeError: fuzz"),
                m.encode_heartbeat(1), m.encode_hello_executor(capacity, 1)]
    return [m.encode_generate("fz-g", params, True, prompt="hello"),
            m.encode_generate("fz-t", params, True, prompt_token_ids=[1, 2, 3]),
            m.encode_generate("fz-c", params, True, messages=[{"role": "user",
                                                                "content": "hi"}]),
            m.pack("abort", {"id": "fz-g"}), m.pack("health", {"id": "fz-h"})]


def _other_messages() -> list[bytes]:
    """Valid messages of other sockets: an unknown type wherever they land."""
    return [m.EngineInfo(1024, 1024, 64, 16).encode(), m.encode_rejected("x", "no"),
            m.encode_outputs([EngineOutput("x", [1], "stop")]), m.encode_stats({"a": 1}),
            m.pack("plan", {"s": 1, "h": [0], "k": [1]}), m.pack("reset", {}),
            m.encode_delta("x", "t", [1]), m.encode_final("x", "t", [1], "stop", 1),
            m.encode_error("x", "invalid", "no"), m.pack("nope", {}), m.pack("", {}),
            m.pack("x" * 10_000, {})]


def _replace_somewhere(rng: random.Random, value):
    """`value` with one field (at any depth of maps and lists) replaced by a bad value."""
    if isinstance(value, dict) and value and rng.random() < 0.7:
        key = rng.choice(list(value))
        return {**value, key: _replace_somewhere(rng, value[key])}
    if isinstance(value, list) and value and rng.random() < 0.5:
        index = rng.randrange(len(value))
        return value[:index] + [_replace_somewhere(rng, value[index])] + value[index + 1:]
    return rng.choice(BAD_VALUES)


def _huge_header(rng: random.Random) -> bytes:
    """msgpack headers that announce far more than follows (or than any limit allows)."""
    big = (2**32 - 1).to_bytes(4, "big")
    mid = (2**22 + 1).to_bytes(4, "big")
    header = rng.choice([b"\xdd" + big, b"\xdf" + big, b"\xdb" + big, b"\xc6" + big,
                         b"\xdd" + mid, b"\xdf" + mid, b"\xdc\xff\xff", b"\xde\xff\xff"])
    where = rng.randrange(3)
    if where == 0:
        return header + bytes(rng.randrange(256) for _ in range(rng.randrange(16)))
    if where == 1:   # as the body
        return b"\x93\x01\xa3add" + header + b"\xa2id"
    return b"\x93\x01" + header   # as the type


def _fuzz_messages(socket: str, count: int, seed: int) -> list[list[bytes]]:
    """`count` messages (each a list of frames) for one socket."""
    rng = random.Random(seed)
    valid = _valid_messages(socket)
    others = _other_messages()
    decoded = [msgpack.unpackb(data, raw=False) for data in valid]
    out: list[list[bytes]] = []
    while len(out) < count:
        kind = rng.randrange(12)
        base = rng.choice(valid)
        if kind == 0:     # random bytes
            data = bytes(rng.randrange(256) for _ in range(rng.randrange(200)))
        elif kind == 1:   # truncated
            data = base[:rng.randrange(len(base))]
        elif kind == 2:   # flipped bits
            raw = bytearray(base)
            for _ in range(rng.randint(1, 4)):
                raw[rng.randrange(len(raw))] ^= 1 << rng.randrange(8)
            data = bytes(raw)
        elif kind == 3:   # bytes inserted or cut out
            cut = rng.randrange(len(base))
            data = (base[:cut] + bytes(rng.randrange(256) for _ in range(rng.randint(1, 8)))
                    + base[cut + rng.randrange(3):])
        elif kind in (4, 5, 6):   # a wrong type (or value) in one field, at any depth
            version, msg_type, body = rng.choice(decoded)
            data = msgpack.packb([version, msg_type, _replace_somewhere(rng, body)])
        elif kind == 7:   # wrong protocol version
            _, msg_type, body = rng.choice(decoded)
            version = rng.choice([0, 2, -1, 255, 2**64 - 1, "1", None, 1.5, [1], {}])
            data = msgpack.packb([version, msg_type, body])
        elif kind == 8:   # unknown types, and other sockets' messages
            data = rng.choice(others)
        elif kind == 9:   # huge lengths
            data = _huge_header(rng)
        elif kind == 10:  # wrong shapes
            _, msg_type, body = rng.choice(decoded)
            data = msgpack.packb(rng.choice([
                [PROTOCOL_VERSION, msg_type], [PROTOCOL_VERSION, msg_type, body, 1],
                {"v": 1, "t": msg_type, "b": body}, [PROTOCOL_VERSION, 5, body],
                [PROTOCOL_VERSION, msg_type, [body]], [PROTOCOL_VERSION, msg_type, None],
                "add", 7, None, []]))
        else:             # deep nesting, several frames, empty frames
            choice = rng.randrange(3)
            if choice == 0:
                data = b"\x91" * rng.randint(100, 100_000) + b"\xc0"
            elif choice == 1:
                out.append([base, base] if rng.random() < 0.5 else [b"", base, b""])
                continue
            else:
                data = b""
        if socket == "scheduler-executor" and _is_valid_hello(data):
            continue   # a stray executor's hello is its own test
        out.append([data])
    # Two big ones: a prompt of the most token ids a message may hold, and one more.
    for size in (2**22, 2**22 + 1):
        big = {"scheduler-frontends": m.pack("add", {"id": "fz-big", "prompt": [1] * size,
                                                     "params": {}}),
               "scheduler-executor": m.pack("result", {"s": 0, "h": [0] * size,
                                                       "t": [1] * size}),
               "frontend-clients": m.pack("generate", {"id": "fz-big", "params": {},
                                                       "prompt_token_ids": [1] * size})}
        out.insert(rng.randrange(len(out)), [big[socket]])
    return out


def _is_valid_hello(data: bytes) -> bool:
    try:
        _, body = m.decode(data, frozenset({"executor_hello"}))
        m.decode_hello_executor(body)
    except Exception:
        return False
    return True


def test_zeromq_fuzz_10000_messages_per_socket_leaves_everything_serving(healthy):
    targets = {"scheduler-frontends": healthy.frontend_address,
               "scheduler-executor": healthy.executor_address,
               "frontend-clients": healthy.client_addresses[0]}
    ctx = zmq.Context()
    started = time.monotonic()
    try:
        for seed, (socket, address) in enumerate(targets.items()):
            messages = _fuzz_messages(socket, 10_000, seed)
            sock = ctx.socket(zmq.DEALER)
            sock.setsockopt(zmq.LINGER, 0)
            sock.setsockopt(zmq.SNDHWM, 0)
            sock.connect(address)
            for frames in messages:
                sock.send_multipart(frames)
            time.sleep(0.5)
            sock.close()
            # Over the 64 MiB message limit: ZeroMQ drops this connection, nothing else.
            big = ctx.socket(zmq.DEALER)
            big.setsockopt(zmq.LINGER, 0)
            big.connect(address)
            big.send(b"\x00" * (64 * 2**20 + 1))
            time.sleep(0.3)
            big.close()
            healthy.check_alive()
    finally:
        ctx.term()
    print(f"fuzzed 3 sockets in {time.monotonic() - started:.1f} s")
    healthy.check_alive()
    healthy.wait_ready(timeout=30)   # the frontend may still be reading the fuzz
    for frontend in (0, 1):
        healthy.assert_serving(frontend)
    assert httpx.get(f"{healthy.base}/health").status_code == 200


def test_an_absurd_temperature_is_refused_and_the_largest_accepted_one_is_served(healthy):
    """temperature = 2**63 over HTTP and over the SDK wire is refused by name; 1e4 (the
    largest accepted: a near-uniform draw) is served. A request running beside both must
    finish normally (the executor must not fail the whole batch over one row)."""

    async def run():
        async with AsyncClient(healthy.client_addresses[0]) as client, \
                httpx.AsyncClient(base_url=healthy.base, timeout=30) as http:
            started = asyncio.Event()
            bystander = asyncio.create_task(_sdk_stream(client, started))
            await asyncio.wait_for(started.wait(), 20)
            over_http = await http.post("/v1/completions", json={
                "prompt": "x", "max_tokens": 4, "temperature": 2**63})
            hot = await http.post("/v1/completions", json={
                "prompt": "x", "max_tokens": 4, "temperature": 1e4, "ignore_eos": True})
            raw = SamplingParams(max_tokens=4).to_dict() | {"temperature": 2**63}
            ctx = zmq.asyncio.Context()
            sock = ctx.socket(zmq.DEALER)
            try:
                sock.setsockopt(zmq.LINGER, 0)
                sock.connect(healthy.client_addresses[0])
                await sock.send(m.pack("generate", {"id": "hot", "params": raw,
                                                    "prompt_token_ids": [1, 2, 3]}))
                replies = []
                while not replies or replies[-1][0] not in ("final", "error"):
                    replies.append(m.unpack(await asyncio.wait_for(sock.recv(), 20)))
            finally:
                sock.close()
                ctx.term()
            tokens = await _value_or_error(asyncio.wait_for(bystander, 60))
            return over_http, hot, replies[-1], tokens

    over_http, hot, over_sdk, tokens = asyncio.run(run())
    assert over_http.status_code == 400, over_http.text[:300]
    assert "temperature must be <= 10000" in over_http.json()["error"]["message"]
    assert over_sdk[0] == "error" and over_sdk[1]["code"] == "invalid", over_sdk
    assert "temperature" in over_sdk[1]["message"], over_sdk
    assert hot.status_code == 200, hot.text[:300]
    assert hot.json()["usage"]["completion_tokens"] == 4
    assert tokens == LONG, f"the request running beside it ended with {tokens!r}"


def test_a_stray_executor_hello_does_not_take_over_the_engine(healthy):
    """Any peer of the executor socket can send a well-formed executor_hello (a mutated
    message can be one). Once that peer is gone, the real executor must serve again."""
    capacity = ExecutorCapacity(num_kv_blocks=64, block_size=16, max_model_len=1024,
                                vocab_size=1024, eos_token_ids=(0,))
    ctx = zmq.Context()
    try:
        stray = ctx.socket(zmq.DEALER)
        stray.setsockopt(zmq.LINGER, 0)
        stray.connect(healthy.executor_address)
        stray.send(m.encode_hello_executor(capacity, 424242))
        time.sleep(0.5)
        stray.close()
    finally:
        ctx.term()
    healthy.wait_ready(timeout=10)
    healthy.assert_serving()


# ---- HTTP nasty cases -------------------------------------------------------------------------

ALLOWED = (200, 400, 404, 408, 503)
ONE_SHOT = {"Connection": "close"}   # one connection per case: a failure cannot leak over


def _problems(response: httpx.Response, case: str) -> list[str]:
    """Why this response breaks the rules (an empty list: it does not)."""
    if response.status_code not in ALLOWED:
        return [f"{case}: HTTP {response.status_code}: {response.text[:200]}"]
    if response.status_code == 200:
        return []
    try:
        error = response.json()["error"]
    except (ValueError, KeyError, TypeError):
        return [f"{case}: HTTP {response.status_code} without the error envelope: "
                f"{response.text[:200]}"]
    if set(error) != {"message", "type", "param", "code"} or not error["message"]:
        return [f"{case}: malformed error envelope {error}"]
    return []


def _post(http: httpx.Client, path: str, body, case: str) -> list[str]:
    content = body if isinstance(body, bytes) else json.dumps(body).encode()
    try:
        response = http.post(path, content=content,
                             headers={"Content-Type": "application/json"})
    except httpx.TransportError as error:   # no answer at all is a problem too
        return [f"{case}: no HTTP answer: {type(error).__name__}: {error}"]
    return _problems(response, case)


def _nasty_cases() -> list[tuple[str, str, bytes]]:
    c, chat = "/v1/completions", "/v1/chat/completions"
    ok = {"prompt": "hi", "max_tokens": 2}
    user = [{"role": "user", "content": "hi"}]
    cases: list[tuple[str, str, object]] = [
        ("invalid utf-8", c, b'{"prompt": "\xff\xfe\xfd", "max_tokens": 2}'),
        ("invalid utf-8 in chat", chat, b'{"messages": [{"role": "user", "content": "\xc3"}]}'),
        ("lone surrogate in prompt", c, {**ok, "prompt": "\ud800abc"}),
        ("lone surrogate in chat", chat, {"messages": [{"role": "user", "content": "\udfff"}],
                                          "max_tokens": 2}),
        ("lone surrogate in role", chat, {"messages": [{"role": "\ud800", "content": "x"}]}),
        ("lone surrogate in stop", c, {**ok, "stop": ["\ud800"]}),
        ("10 MB prompt", c, {"prompt": "a" * 10_000_000, "max_tokens": 2}),
        ("10 MB of junk", c, b"\x00" * 10_000_000),
        ("100k nested arrays", c, b"[" * 100_000 + b"]" * 100_000),
        ("100k nested objects", c, b'{"a":' * 100_000 + b"1" + b"}" * 100_000),
        ("100k nested prompt", c, b'{"prompt": ' + b"[" * 100_000 + b"]" * 100_000 + b"}"),
        ("900 nested prompt", c, b'{"prompt": ' + b"[" * 900 + b"1" + b"]" * 900 + b"}"),
        ("900 nested messages", chat, b'{"messages": ' + b"[" * 900 + b"]" * 900 + b"}"),
        ("NaN temperature", c, b'{"prompt": "hi", "max_tokens": 2, "temperature": NaN}'),
        ("Infinity top_p", c, b'{"prompt": "hi", "max_tokens": 2, "top_p": Infinity}'),
        ("1e999 temperature", c, b'{"prompt": "hi", "max_tokens": 2, "temperature": 1e999}'),
        ("huge n", c, {**ok, "n": 10**9}), ("n 2^64", c, {**ok, "n": 2**64}),
        ("n 2^100", chat, {"messages": user, "n": 2**100}),
        ("huge logprobs", c, {**ok, "logprobs": 10**9}),
        ("logprobs 2^70", c, {**ok, "logprobs": 2**70}),
        ("huge top_logprobs", chat, {"messages": user, "logprobs": True,
                                     "top_logprobs": 10**12}),
        ("max_tokens 2^63", c, {**ok, "max_tokens": 2**63}),
        ("max_tokens 2^64", c, {**ok, "max_tokens": 2**64}),
        ("max_tokens 10^30", c, {**ok, "max_tokens": 10**30}),
        ("max_completion_tokens 2^64", chat, {"messages": user,
                                              "max_completion_tokens": 2**64}),
        ("min_tokens 2^64", c, {**ok, "min_tokens": 2**64}),
        ("top_k 2^64", c, {**ok, "top_k": 2**64}),
        ("top_k 2^63", c, {**ok, "top_k": 2**63}),
        ("seed 2^64", c, {**ok, "seed": 2**64}),
        ("seed -2^70", c, {**ok, "seed": -2**70}),
        ("prompt id 2^64", c, {**ok, "prompt": [2**64]}),
        ("stop id 2^64", c, {**ok, "stop_token_ids": [2**64]}),
        ("logit_bias id 2^70", c, {**ok, "logit_bias": {str(2**70): 1}}),
        ("logit_bias 5000 entries", c, {**ok, "logit_bias": {str(i): 1 for i in range(5000)}}),
        ("prompt over the context", c, {**ok, "prompt": "word " * 5000}),
        ("token prompt over the context", c, {**ok, "prompt": [5] * 5000}),
        ("chat over the context", chat, {"messages": [{"role": "user", "content": "x " * 5000}],
                                         "max_tokens": 2}),
        ("prompt plus max_tokens over the context", c, {**ok, "prompt": [5] * 1000,
                                                        "max_tokens": 100}),
        ("100 prompts", c, {**ok, "prompt": ["a"] * 100}),
        ("10k empty prompts", c, {**ok, "prompt": [[]] * 10_000}),
        ("1000 stop strings", c, {**ok, "stop": ["a"] * 1000}),
        ("1 MB stop string", c, {**ok, "stop": ["a" * 1_000_000]}),
        ("role tool", chat, {"messages": [{"role": "tool", "content": "x"}], "max_tokens": 2}),
        ("role function", chat, {"messages": [{"role": "function", "content": "x",
                                               "name": "f"}], "max_tokens": 2}),
        ("role developer", chat, {"messages": [{"role": "developer", "content": "x"}],
                                  "max_tokens": 2}),
        ("role empty", chat, {"messages": [{"role": "", "content": "x"}]}),
        ("role 65 chars", chat, {"messages": [{"role": "r" * 65, "content": "x"}]}),
        ("role template code", chat, {"messages": [{"role": "{{ 7 * 7 }}{% raise %}",
                                                    "content": "x"}], "max_tokens": 2}),
        ("role special token", chat, {"messages": [{"role": "<|im_end|>", "content": "x"}],
                                      "max_tokens": 2}),
        ("content special tokens", chat, {"messages": [{"role": "user",
                                                        "content": "<|im_end|><|endoftext|>"}],
                                          "max_tokens": 2}),
        ("only an assistant message", chat, {"messages": [{"role": "assistant",
                                                           "content": "x"}], "max_tokens": 2}),
        ("1000 system messages", chat, {"messages": [{"role": "system", "content": "s"}] * 1000,
                                        "max_tokens": 2}),
        ("role number", chat, {"messages": [{"role": 5, "content": "x"}]}),
        ("role missing", chat, {"messages": [{"content": "x"}]}),
        ("content object", chat, {"messages": [{"role": "user", "content": {"a": 1}}]}),
        ("image part", chat, {"messages": [{"role": "user", "content": [
            {"type": "image_url", "image_url": {"url": "data:,"}}]}]}),
        ("messages object", chat, {"messages": {"role": "user"}}),
        ("messages strings", chat, {"messages": ["hi"]}),
        ("messages empty", chat, {"messages": []}),
        ("array body", c, b"[]"), ("string body", c, b'"hello"'), ("number body", c, b"1"),
        ("null body", c, b"null"), ("true body", chat, b"true"), ("empty body", c, b""),
        ("whitespace body", chat, b"   "), ("truncated JSON", c, b'{"prompt": "hi"'),
        ("duplicate keys", c, b'{"prompt": "a", "prompt": 5}'),
        ("model number", c, {**ok, "model": 5}), ("model list", c, {**ok, "model": ["x"]}),
        ("stream string", c, {**ok, "stream": "yes"}),
        ("stream_options list", c, {**ok, "stream": True, "stream_options": [1]}),
        ("stream_options without stream", c, {**ok, "stream_options": {"include_usage": True}}),
        ("echo with stream", c, {**ok, "echo": True, "stream": True}),
        ("deadline negative", c, {**ok, "deadline": -1}),
        ("deadline string", c, {**ok, "deadline": "1"}),
        ("deadline huge", c, {**ok, "deadline": 10**30}),
        ("unknown fields", c, {**ok, "frobnicate": {"x": [1, 2]}, "tools": [1]}),
    ]
    return [(name, path, body if isinstance(body, bytes) else json.dumps(body).encode())
            for name, path, body in cases]


def test_http_nasty_requests_get_documented_errors_in_the_envelope(healthy):
    problems = []
    with httpx.Client(base_url=healthy.base, timeout=60, headers=ONE_SHOT) as http:
        for name, path, body in _nasty_cases():
            problems += _post(http, path, body, name)
    healthy.check_alive()
    assert not problems, "\n".join(problems)
    healthy.assert_serving()


FIELDS_COMPLETIONS = ("model", "prompt", "max_tokens", "temperature", "top_p", "n", "stream",
                      "stream_options", "stop", "seed", "presence_penalty",
                      "frequency_penalty", "logit_bias", "logprobs", "echo", "user", "top_k",
                      "min_p", "repetition_penalty", "ignore_eos", "min_tokens",
                      "skip_special_tokens", "include_stop_str_in_output", "stop_token_ids",
                      "deadline", "suffix", "best_of")
FIELDS_CHAT = ("model", "messages", "max_tokens", "max_completion_tokens", "logprobs",
               "top_logprobs", "n", "stream", "stream_options", "stop", "seed", "temperature",
               "response_format", "tools", "tool_choice", "deadline")
WRONG = [None, True, False, 0, -1, 1, 2**31, 2**63, 2**64, -2**64, 1.5, -0.5, 1e308, "",
         "x", "1", [], [1], ["a"], [[1]], [None], {}, {"a": 1}, {"1": 1}]


def test_http_wrong_types_in_every_field(healthy):
    problems = []
    base_completion = {"prompt": "hi", "max_tokens": 2}
    base_chat = {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}
    with httpx.Client(base_url=healthy.base, timeout=60, headers=ONE_SHOT) as http:
        for path, base, fields in (("/v1/completions", base_completion, FIELDS_COMPLETIONS),
                                   ("/v1/chat/completions", base_chat, FIELDS_CHAT)):
            for field_name in fields:
                for value in WRONG:
                    body = {**base, field_name: value}
                    if field_name not in ("max_tokens", "max_completion_tokens") and \
                            "max_tokens" not in body:
                        body["max_tokens"] = 2
                    problems += _post(http, path, body, f"{path} {field_name}={value!r}")
    healthy.check_alive()
    assert not problems, f"{len(problems)} bad responses:\n" + "\n".join(problems[:40])
    healthy.assert_serving()


def _json_values(rng: random.Random, depth: int = 0):
    pick = rng.randrange(10 if depth < 3 else 7)
    if pick == 0:
        return None
    if pick == 1:
        return rng.choice([True, False])
    if pick == 2:
        return rng.choice([0, 1, 2, -1, 16, 2**31, 2**63, 2**64, -2**63 - 1, 10**20])
    if pick == 3:
        return rng.choice([0.0, 0.5, 1.0, -1.5, 1e-9, 1e308, -1e308, 2.5])
    if pick in (4, 5):
        return rng.choice(["", "hi", "user", "system", "assistant", "text", "\u0000",
                           "é" * 50, "<|im_start|>", "{{ x }}", "a" * 5000])
    if pick == 6:
        return [rng.randrange(-5, 2000) for _ in range(rng.randrange(6))]
    if pick in (7, 8):
        return [_json_values(rng, depth + 1) for _ in range(rng.randrange(4))]
    keys = ["role", "content", "type", "text", "include_usage", "1", "x"]
    return {rng.choice(keys): _json_values(rng, depth + 1) for _ in range(rng.randrange(4))}


def test_http_random_bodies(healthy):
    """A few hundred bodies from a model of the OpenAI request schema, with random values
    (the server's /openapi.json has no request schemas to fuzz from)."""
    rng = random.Random(9)
    problems = []
    with httpx.Client(base_url=healthy.base, timeout=60, headers=ONE_SHOT) as http:
        for i in range(300):
            chat = rng.random() < 0.5
            fields = FIELDS_CHAT if chat else FIELDS_COMPLETIONS
            body = {name: _json_values(rng) for name in rng.sample(fields, rng.randint(1, 8))}
            if rng.random() < 0.7:   # mostly with a usable prompt, so later checks are hit
                body.setdefault("messages" if chat else "prompt",
                                [{"role": "user", "content": "hi"}] if chat else "hi")
            body["max_tokens"] = rng.choice([1, 2, 3, None, 0, "2"])
            path = "/v1/chat/completions" if chat else "/v1/completions"
            problems += _post(http, path, body, f"#{i} {path} {json.dumps(body)[:150]}")
    healthy.check_alive()
    assert not problems, f"{len(problems)} bad responses:\n" + "\n".join(problems[:40])
    healthy.assert_serving()


def test_unknown_routes_and_methods_answer_in_the_error_envelope(healthy):
    problems = []
    with httpx.Client(base_url=healthy.base, timeout=10) as http:
        for method, path in (("GET", "/v1/completions"), ("GET", "/v1/chat/completions"),
                             ("POST", "/v1/models"), ("GET", "/v1/nope"),
                             ("DELETE", "/v1/completions"), ("POST", "/v1/embeddings")):
            response = http.request(method, path)
            if response.status_code not in (404, 405):
                problems.append(f"{method} {path}: HTTP {response.status_code}")
            elif "error" not in response.json():
                problems.append(f"{method} {path}: {response.status_code} {response.text}")
    assert not problems, "\n".join(problems)


# ---- faults -----------------------------------------------------------------------------------
# Each fault hits requests that are surely running: an SDK stream and an HTTP stream that have
# produced tokens, and a plain HTTP request sent with them, each of 300 tokens (about 20 blocks
# each, so the three fit the 64-block pool together without preemption).

LONG = 300


async def _sdk_stream(client: AsyncClient, started: asyncio.Event, max_tokens: int = LONG
                      ) -> int:
    """Tokens of a long SDK stream (raises what the SDK raises); sets `started` at the first."""
    count = 0
    async for delta in client.stream([7] * 20, SamplingParams(max_tokens=max_tokens, **GREEDY),
                                     timeout=30):
        count += len(delta.token_ids)
        started.set()
    return count


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
    jobs = {"sdk": asyncio.create_task(_sdk_stream(client, sdk_started, max_tokens)),
            "stream": asyncio.create_task(_http_stream(http, http_started, max_tokens)),
            "plain": asyncio.create_task(http.post("/v1/completions", json={
                "prompt": [8] * 20, "max_tokens": max_tokens, **GREEDY}))}
    await asyncio.wait_for(asyncio.gather(sdk_started.wait(), http_started.wait()), 60)
    assert not any(job.done() for job in jobs.values()), "a request ended before the fault"
    return jobs


async def _value_or_error(awaitable):
    """What a call returned, or the Folio error it raised (tests assert on either)."""
    try:
        return await awaitable
    except FolioError as error:
        return error


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
            sdk_during = await _value_or_error(
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
            job = asyncio.create_task(_sdk_stream(client, started))
            await asyncio.wait_for(started.wait(), 20)
            healthy.signal("frontend1", signal.SIGKILL)
            pending = (await _outcomes({"sdk": job}))["sdk"]
            later = await _value_or_error(
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
                    await asyncio.sleep(0.5)
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
