"""The KV page map: the scheduler's snapshot against its own stats, the message's checks,
and GET /v1/kv/map plus Client.kv_map() against a running server."""

from __future__ import annotations

import threading
import time

import httpx
import pytest

from folio.client import Client
from folio.scheduler.scheduler import Scheduler
from folio.shared.protocol import messages as m
from folio.shared.config import SchedulerConfig
from folio.shared.sampling_params import SamplingParams
from folio.shared.protocol.wire import Body, ProtocolError, unpack
from folio.scheduler.service import KV_MAP_MAX_AGE_S, SchedulerService, SchedulerServiceConfig
from folio.shared.config import ExecutorCapacity
from tests.fake_executor import FakeExecutor
from tests.http_server import HttpServer

KEY = "sk-kv-map"


def _scheduler(**overrides) -> tuple[Scheduler, FakeExecutor]:
    fields = dict(num_kv_blocks=16, block_size=4, max_num_seqs=8, max_num_batched_tokens=64,
                  max_model_len=32)
    fields.update(overrides)
    config = SchedulerConfig(**fields)
    return Scheduler(config), FakeExecutor(4, config.num_kv_blocks, config.num_swap_blocks)


def _step(scheduler: Scheduler, executor: FakeExecutor) -> None:
    plan = scheduler.schedule()
    scheduler.update(plan, executor.execute(plan))


def check_against_stats(snapshot: dict, stats: dict) -> None:
    """What every map must agree on with stats() taken at the same moment."""
    totals, blocks = snapshot["totals"], snapshot["blocks"]
    assert totals["total"] == stats["kv_blocks_total"] == len(blocks["state"])
    assert totals["free"] + totals["used"] + totals["cached"] == totals["total"]
    assert totals["used"] == stats["kv_blocks_used"]
    assert totals["cached"] == stats["kv_blocks_cached"]
    assert totals["free"] + totals["cached"] == stats["kv_blocks_free"]
    assert blocks["state"].count("U") == totals["used"]
    assert blocks["state"].count("C") == totals["cached"]
    owners: dict[int, list[int]] = {}
    for index, request in enumerate(snapshot["requests"]):
        for block_id in request["blocks"]:
            owners.setdefault(block_id, []).append(index)
    shared = dict((block_id, listed) for block_id, listed in snapshot["shared"])
    for block_id, state in enumerate(blocks["state"]):
        ref = blocks["ref"][block_id]
        if state == "U":   # every block in use is owned, once per reference
            assert ref == len(owners[block_id]) >= 1
            assert blocks["owner"][block_id] == owners[block_id][0]
            assert shared.get(block_id, owners[block_id][:1]) == owners[block_id]
        else:
            assert ref == 0 and blocks["owner"][block_id] == -1 and block_id not in owners


def test_map_during_a_run_and_at_idle():
    scheduler, executor = _scheduler()
    prefix = list(range(12))   # three full blocks both prompts share
    scheduler.add_request("a", prefix + [50], SamplingParams(max_tokens=6))
    scheduler.add_request("b", prefix + [60, 61], SamplingParams(max_tokens=6))
    _step(scheduler, executor)
    snapshot = scheduler.kv_map()
    check_against_stats(snapshot, scheduler.stats())
    a, b = snapshot["requests"]
    assert (a["id"], a["state"], b["state"]) == ("a", "running", "running")
    assert a["blocks"][:3] == b["blocks"][:3]
    refs = snapshot["blocks"]["ref"]
    assert [refs[block_id] for block_id in a["blocks"][:3]] == [2, 2, 2]
    assert snapshot["totals"]["shared"] == 3
    assert sorted(block for block, _ in snapshot["shared"]) == sorted(a["blocks"][:3])
    # a holds 13 computed tokens in 4 blocks: the last one has one slot filled.
    assert [snapshot["blocks"]["fill"][block_id] for block_id in a["blocks"]] == [4, 4, 4, 1]
    assert snapshot["totals"]["slot_utilization"] == pytest.approx(
        scheduler.stats()["kv_slot_utilization"])
    contiguous = snapshot["contiguous"]
    assert (contiguous["blocks_per_request"], contiguous["fits"]) == (8, 2)
    assert contiguous["blocks_needed"] == 16
    while scheduler.has_unfinished_requests():
        _step(scheduler, executor)
        check_against_stats(scheduler.kv_map(), scheduler.stats())
    idle = scheduler.kv_map()
    assert idle["requests"] == [] and idle["totals"]["used"] == 0
    assert set(idle["blocks"]["state"]) <= {"F", "C"} and idle["totals"]["cached"] >= 3
    assert idle["blocks"]["state"].count("C") == idle["totals"]["cached"]


def test_waiting_swapped_and_preempted_states():
    scheduler, executor = _scheduler(num_kv_blocks=6, num_swap_blocks=8, max_model_len=24,
                                     preemption_mode="swap")
    for name in "abcd":   # two blocks each: three fit, the fourth waits
        scheduler.add_request(name, [ord(name)] * 7, SamplingParams(max_tokens=12))
    _step(scheduler, executor)
    snapshot = scheduler.kv_map()
    states = {r["id"]: r["state"] for r in snapshot["requests"]}
    assert states == {"a": "running", "b": "running", "c": "running", "d": "waiting"}
    assert [snapshot["requests"][i]["id"] for i in snapshot["waiting"]] == ["d"]
    swapped = None
    for _ in range(40):
        _step(scheduler, executor)
        snapshot = scheduler.kv_map()
        check_against_stats(snapshot, scheduler.stats())
        if snapshot["swapped"]:
            swapped = snapshot
            break
    assert swapped is not None, "no request was swapped out"
    request = swapped["requests"][swapped["swapped"][0]]
    assert request["state"] == "swapped" and request["blocks"] == []
    assert request["swap_blocks"] and request["preemptions"] == 1
    swap = swapped["swap"]
    assert [swap["owner"][b] for b in request["swap_blocks"]] == [swapped["swapped"][0]] * len(
        request["swap_blocks"])
    assert swap["state"].count("U") == swapped["totals"]["swap_used"] == len(
        request["swap_blocks"])
    while scheduler.has_unfinished_requests():
        _step(scheduler, executor)
    assert scheduler.kv_map()["totals"]["swap_used"] == 0


def test_message_round_trip_and_checks():
    scheduler, executor = _scheduler()
    scheduler.add_request("a", list(range(9)), SamplingParams(max_tokens=4))
    _step(scheduler, executor)
    snapshot = scheduler.kv_map()
    msg_type, body = unpack(m.encode_kv_map(snapshot, "c1"))
    assert (msg_type, body["id"]) == ("kv_map", "c1")
    assert m.decode_kv_map(Body(msg_type, body)) == snapshot
    assert m.decode_kv_map(Body("kv_map", {"map": {}})) is None

    def broken(change) -> None:
        raw = unpack(m.encode_kv_map(snapshot))[1]
        change(raw["map"])
        with pytest.raises(ProtocolError):
            m.decode_kv_map(Body("kv_map", raw))

    broken(lambda s: s["blocks"]["owner"].__setitem__(0, 5))      # no such request
    broken(lambda s: s["blocks"].__setitem__("state", "X" * 16))  # not a state
    broken(lambda s: s["blocks"]["fill"].pop())                   # one entry short
    broken(lambda s: s["requests"][0].__setitem__("state", "lost"))
    broken(lambda s: s.__setitem__("waiting", [3]))
    broken(lambda s: s["totals"].__setitem__("used", "many"))


@pytest.mark.slow
def test_http_and_sdk_map_against_stats(tmp_path, llama_dir):
    server = HttpServer(llama_dir, tmp_path, "--api-key", KEY, "--num-kv-blocks", "512",
                        "--block-size", "4", "--max-num-seqs", "4")
    try:
        server.wait_ready()
        url = f"{server.base}/v1/kv/map"
        assert httpx.get(url, timeout=5).status_code == 401
        headers = {"Authorization": f"Bearer {KEY}"}
        with Client(server.zmq_address) as sdk:
            idle = httpx.get(url, headers=headers, timeout=5).json()
            assert idle["object"] == "kv_map" and idle["totals"]["used"] == 0
            assert idle["num_blocks"] == 512 and idle["block_size"] == 4
            check_against_stats(idle, sdk.health()["stats"])

            # As long as the context allows: both must still run when a look comes.
            body = {"prompt": "the same long shared prefix " * 4, "max_tokens": 900,
                    "temperature": 0.0, "ignore_eos": True}
            done = []
            workers = [threading.Thread(target=lambda: done.append(httpx.post(
                f"{server.base}/v1/completions", json=body, headers=headers, timeout=120)))
                for _ in range(2)]
            for worker in workers:
                worker.start()
            seen, counts = None, []
            deadline = time.monotonic() + 60
            while time.monotonic() < deadline and seen is None and len(done) < 2:
                snapshot = sdk.kv_map()
                counts.append(len(snapshot["running"]))
                if counts[-1] == 2:
                    seen = snapshot
                time.sleep(0.02)
            assert seen is not None, f"never saw both running: {done}, running {counts}"
            assert seen["totals"]["used"] > 0 and seen["totals"]["shared"] >= 1
            assert max(seen["blocks"]["ref"]) == 2
            assert set(seen["requests"][0]) == {   # ids and counts, never token ids
                "id", "state", "blocks", "swap_blocks", "computed", "tokens", "prompt_tokens",
                "max_tokens", "preemptions", "spec_steps", "spec_accepted", "wait_s", "age_s"}
            for worker in workers:
                worker.join(120)
            assert [r.status_code for r in done] == [200, 200]
            deadline = time.monotonic() + 10   # maps are shared for 0.25 s: one may be stale
            while True:
                after = httpx.get(url, headers=headers, timeout=5).json()
                if after["totals"]["used"] == 0 or time.monotonic() > deadline:
                    break
                time.sleep(0.1)
            assert after["totals"]["used"] == 0 and after["requests"] == []
            assert set(after["blocks"]["state"]) <= {"F", "C"}
            check_against_stats(after, sdk.health()["stats"])
    finally:
        server.stop()


def test_forked_samples_share_their_prompt_blocks():
    scheduler, executor = _scheduler()
    scheduler.add_request("n", list(range(9)), SamplingParams(n=3, max_tokens=3, seed=1))
    snapshot = scheduler.kv_map()
    assert [r["state"] for r in snapshot["requests"]] == ["waiting", "forking", "forking"]
    _step(scheduler, executor)   # the first sample computes the prompt; the others fork
    snapshot = scheduler.kv_map()
    check_against_stats(snapshot, scheduler.stats())
    ids = [r["id"] for r in snapshot["requests"]]
    assert sorted(ids) == ["n#0", "n#1", "n#2"]
    # Two full prompt blocks shared by all three; each has its own copy of the third.
    assert sorted(owners for _, owners in snapshot["shared"]) == [[0, 1, 2], [0, 1, 2]]
    assert snapshot["totals"]["used"] == 5


def test_service_shares_one_map_per_interval(tmp_path):
    service = SchedulerService(SchedulerServiceConfig(
        frontend_address=f"ipc://{tmp_path}/fe.sock",
        executor_address=f"ipc://{tmp_path}/ex.sock"))
    try:
        def answer() -> dict | None:
            return m.decode_kv_map(Body("kv_map", unpack(service._kv_map_reply())[1]))

        assert answer() is None   # no executor yet
        service._on_executor_hello(b"executor-test", ExecutorCapacity(
            num_kv_blocks=32, block_size=16, max_model_len=256, vocab_size=1024,
            eos_token_ids=(0,)), 4242)
        assert answer()["num_blocks"] == 32   # a new executor is seen at once
        first = service._kv_map_reply()
        service.scheduler.add_request("r", [1, 2, 3], SamplingParams(max_tokens=2))
        assert service._kv_map_reply() is first   # within the interval: the same answer
        time.sleep(KV_MAP_MAX_AGE_S + 0.05)
        assert [r["id"] for r in answer()["requests"]] == ["r"]
    finally:
        service.close()
