"""Issue 25 (part 3, item 2), served: a client that sends and never reads costs only itself.

One `folio serve` (HTTP API and ZeroMQ) with a small per-client cap. A raw DEALER whose
receive queue holds one message sends streamed generates as fast as it can for a few
seconds and never reads, then leaves. Meanwhile an SDK client and HTTP clients are served
right, the engine never holds more of the attacker's requests than the cap (before the fix
it held every one it sent), and after it left every KV block comes back; the log has no
traceback and a line or two about it, not one per message.
"""

from __future__ import annotations

import asyncio
import multiprocessing
import time
import uuid

import httpx
import pytest
import zmq

from folio import SamplingParams
from folio.client import AsyncClient, Client
from folio.errors import QueueFull, RequestRejected
from folio.shared.protocol import messages as m
from tests.http_server import HttpServer
from tests.soak.nonreading_client import non_reading_dealer

pytestmark = pytest.mark.slow
CAP = 16
NUM_KV_BLOCKS = 512
GREEDY = SamplingParams(temperature=0, ignore_eos=True, max_tokens=4)
ATTACK_S = 4.0          # how long it sends
ATTACK_MESSAGES = 4000  # ... and at most this many


@pytest.fixture(scope="module")
def server(tmp_path_factory, llama_dir):
    srv = HttpServer(llama_dir, tmp_path_factory.mktemp("rel4reader"),
                     "--max-requests-per-client", str(CAP),
                     "--num-kv-blocks", str(NUM_KV_BLOCKS))
    try:
        srv.wait_ready()
        yield srv
    finally:
        srv.stop()


def _attack(address: str, sent) -> None:
    """Streamed generates, never reading; then it leaves. Run in a process of its own: a
    client is its process (--max-requests-per-client counts a client's connections
    together), and the bystanders are this one's."""
    ctx = zmq.Context()
    sock = non_reading_dealer(ctx, address)
    params = SamplingParams(max_tokens=64, ignore_eos=True)
    start = time.monotonic()
    try:
        while time.monotonic() - start < ATTACK_S and sent.value < ATTACK_MESSAGES:
            try:
                sock.send(m.encode_generate(uuid.uuid4().hex, params, True,
                                            prompt_token_ids=[5, 6, 7, 8]), zmq.NOBLOCK)
                sent.value += 1
            except zmq.Again:   # the frontend reads slower than this sends
                time.sleep(0.001)
    finally:
        sock.close(0)
        ctx.term()


def _completion(server, prompt: list[int]) -> list:
    response = httpx.post(f"{server.base}/v1/completions", timeout=120, json={
        "prompt": prompt, "max_tokens": 4, "temperature": 0, "ignore_eos": True,
        "logprobs": 0})
    assert response.status_code == 200, response.text
    return response.json()["choices"][0]["text"]


def test_a_client_that_never_reads_costs_only_itself(server):
    log_before = server.log.read_text(errors="replace")
    with Client(server.zmq_address, timeout=120) as sdk, \
            Client(server.zmq_address, timeout=120) as watcher:
        expected_sdk = sdk.generate([1, 2, 3], GREEDY).token_ids
        expected_http = _completion(server, [1, 2, 3])
        spawn = multiprocessing.get_context("spawn")
        sent = spawn.Value("i", 0)
        attacker = spawn.Process(target=_attack, args=(server.zmq_address, sent))
        attacker.start()
        most_held, served, health = 0, 0, []
        deadline = time.monotonic() + 120
        while attacker.is_alive() or served < 3:
            assert time.monotonic() < deadline, "bystanders were not served"
            stats = watcher.health()["stats"]
            most_held = max(most_held, stats["num_running"] + stats["num_waiting"])
            health.append(httpx.get(f"{server.base}/health", timeout=60).status_code)
            assert sdk.generate([1, 2, 3], GREEDY).token_ids == expected_sdk
            assert _completion(server, [1, 2, 3]) == expected_http
            served += 1
        attacker.join()

        # The bystanders' requests ran one at a time beside it: the rest is the attacker's.
        assert sent.value > 3 * CAP, "the attacker hardly sent anything"
        assert most_held <= CAP + 2
        assert set(health) == {200}
        deadline = time.monotonic() + 60
        while True:   # it left: whatever it had comes back
            stats = watcher.health()["stats"]
            if (stats["num_running"] == stats["num_waiting"] == 0
                    and stats["kv_blocks_free"] == stats["kv_blocks_total"]):
                break
            assert time.monotonic() < deadline, f"never idle after it left: {stats}"
            time.sleep(0.1)
        assert sdk.generate([1, 2, 3], GREEDY).token_ids == expected_sdk
    log = server.log.read_text(errors="replace")[len(log_before):]
    assert "Traceback" not in log and "never retrieved" not in log, log[-3000:]
    about = [line for line in log.splitlines() if "folio-frontend" in line and "client" in line]
    assert len(about) <= 3, about


def test_one_process_shares_one_cap_over_its_connections(server):
    """--max-requests-per-client counts clients, not connections: with CAP requests running
    on one connection, this process's other connection is refused too (queue_full, naming
    the flag); a client in another process is not."""
    params = SamplingParams(max_tokens=1000, ignore_eos=True)

    async def main() -> None:
        async with AsyncClient(server.zmq_address, timeout=120) as first, \
                AsyncClient(server.zmq_address, timeout=120) as second:
            streams = [first.stream([5, 6, 7, i], params) for i in range(CAP)]
            await asyncio.gather(*(anext(s) for s in streams))   # all CAP running
            with pytest.raises(QueueFull, match="max-requests-per-client"):
                await second.generate([1, 2, 3], GREEDY)
            other = multiprocessing.get_context("spawn")
            with other.Pool(1) as pool:   # another process: another client
                assert pool.apply(_one_request, (server.zmq_address,)) == 4
            for stream in streams:
                await stream.aclose()
            # Closing a stream aborts its request; the cap comes back as each abort is
            # confirmed (observed: this process is served again).
            deadline = time.monotonic() + 60
            while True:
                try:
                    assert len((await second.generate([1, 2, 3], GREEDY)).token_ids) == 4
                    break
                except QueueFull:
                    assert time.monotonic() < deadline, "the aborted requests kept the cap"
                    await asyncio.sleep(0.05)

    asyncio.run(main())


def _one_request(address: str) -> int:
    with Client(address, timeout=120) as client:
        return len(client.generate([1, 2, 3], GREEDY).token_ids)


def test_an_sdk_request_may_not_ask_a_priority_past_the_floor(server):
    with Client(server.zmq_address, timeout=120) as sdk:
        with pytest.raises(RequestRejected, match="--priority-floor 0"):
            sdk.generate([1, 2, 3], SamplingParams(max_tokens=2, priority=-3))
        assert len(sdk.generate([1, 2, 3], GREEDY).token_ids) == 4
