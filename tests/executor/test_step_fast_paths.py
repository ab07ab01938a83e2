"""The per-step fast paths change no behaviour, no value and no byte.

- The counts cached for the scheduler's decode loops, on each request (num_tokens,
  stop_num_tokens) and in the KV manager's table rows (num_slots, register_at), equal what
  they cache after every step, through recompute and swap preemptions, n > 1 forks, prefix
  hits, sliding windows, a step in flight and a failed step; outputs still match runs alone
  (check_scheduler, Driver).
- The unsigned fast test of shared/protocol/wire.py check_ints (decode_result's `h` and `t`) accepts
  and refuses exactly what the general check does.
- bench/step_overhead.py --repeats reports median and minimum per stage, and the
  scheduler's own sum.
- chain_hash (shared/prefix_hash.py, one function for the scheduler and the router) gives
  the same digests as SHA-256 over the parent hash and struct.pack("<Nq") in two updates.
- BlockPool.allocate_one takes the block allocate(1) would take, evicting the same, and
  KVCacheManager.allocate_slots' one-block path keeps the table and num_slots as before.
- Scheduler.update's plain tokens stay aligned with their request ids when some results
  are skipped (a finished request's) or not plain (first tokens, stops, logprobs).
- encode_plan writes the same bytes for new_block_ids as the list-of-lists form.
"""

from __future__ import annotations

import hashlib
import random
import struct

import msgpack
import pytest

from bench.step_overhead import SCHEDULER_STAGES, breakdown_repeated
from folio.scheduler.kv.block_pool import BlockPool
from folio.scheduler.kv.block_table import NEVER
from folio.scheduler.kv.kv_manager import KVCacheManager
from folio.scheduler.kv.prefix_cache import CachedPrefix
from folio.scheduler.request import Request
from folio.scheduler.scheduler import Scheduler
from folio.shared.protocol import messages as m
from folio.shared.config import SchedulerConfig
from folio.shared.prefix_hash import chain_hash, full_block_hashes
from folio.shared.sampling_params import SamplingParams
from folio.shared.protocol.step import StepPlan, StepResult
from folio.shared.protocol.wire import (INT64, MAX_TOKEN_ID, MAX_TOKENS_PER_MESSAGE, PROTOCOL_VERSION, Body,
                               ProtocolError, check_ints_general)
from tests.scheduler.test_scheduler_properties import (EOS, MAX_MODEL_LEN, PREFIXES, VOCAB, Driver,
                                                       check_scheduler)


def _config(**changes) -> SchedulerConfig:
    base = dict(num_kv_blocks=12, block_size=4, max_num_seqs=6, max_num_batched_tokens=16,
                max_model_len=MAX_MODEL_LEN, eos_token_ids=(EOS,), vocab_size=VOCAB,
                preemption_mode="recompute", num_swap_blocks=8, bytes_per_block=1,
                swap_bytes_per_s=1.0, prefill_tokens_per_s=1.0)
    base.update(changes)
    return SchedulerConfig(**base)


CASES = {
    "recompute": _config(),
    "swap": _config(preemption_mode="swap"),
    "no-prefix-cache": _config(enable_prefix_caching=False, preemption_mode="auto"),
    "window": _config(sliding_window=6, preemption_mode="auto", num_kv_blocks=10),
    "chunked": _config(enable_chunked_prefill=True, max_num_batched_tokens=5),
}


@pytest.mark.parametrize("ahead", [False, True], ids=["serial", "one-step-ahead"])
@pytest.mark.parametrize("case", list(CASES))
def test_cached_counts_stay_in_sync_every_step(case, ahead):
    config = CASES[case]
    driver = Driver(config, ahead)
    for i in range(14):
        prefix = PREFIXES[i % len(PREFIXES)][:8 + 4 * (i % 4)]
        tail = [(i * 13 + k) % VOCAB for k in range(i % 5)]
        driver.add(f"w{i}", prefix + tail, SamplingParams(n=1 + i % 3, max_tokens=6 + i % 9))
        driver.step()
        check_scheduler(driver)   # checks the cached counts of every live request
    steps = 0
    while driver.scheduler.has_work() or driver.sent:
        assert steps < 2000
        driver.step()
        check_scheduler(driver)
        steps += 1
    driver.assert_idle()
    counters = driver.scheduler.counters
    assert counters["forks"] > 0
    assert counters["preemptions_recompute"] + counters["preemptions_swap"] > 0
    if config.enable_prefix_caching and config.sliding_window is None:
        assert counters["prefix_cache_hits"] > 0


def test_register_at_after_a_failed_step_rewinds_with_num_registered():
    config = _config(num_kv_blocks=32)
    scheduler = Scheduler(config)
    scheduler.add_request("a", PREFIXES[0][:16], SamplingParams(max_tokens=8))
    scheduler.schedule()   # registers the prompt's 4 full blocks, unconfirmed
    (request,) = scheduler.running
    row = scheduler.kv._tables[request.handle]   # the manager's own row: nothing else reads it
    assert row.num_registered == 4 and row.register_at == 5 * config.block_size
    scheduler.discard_unconfirmed()   # that step failed
    assert row.num_registered == 0 and row.register_at == config.block_size


def test_register_at_is_never_with_the_prefix_cache_off():
    driver = Driver(_config(enable_prefix_caching=False))
    driver.add("a", PREFIXES[1][:10], SamplingParams(max_tokens=4))
    driver.step()
    (request,) = driver.scheduler.running
    assert driver.scheduler.kv._tables[request.handle].register_at == NEVER
    driver.drain()
    driver.assert_idle()


# ---- decode_result's fast list check ----------------------------------------------------

LISTS = [
    [], [0], [1, 2, 3], [MAX_TOKEN_ID], [MAX_TOKEN_ID + 1], [2**32 - 1], [2**32], [2**63 - 1],
    [2**63], [2**64], [-1], [0, -5], [True], [1, False], [1.0], [1, 2.5], [None], ["1"], [[1]],
    [5, 2**31, 7], [3] * 300, list(range(1000)), None, "abc", 7, {"a": 1},
]


def _decode(handles, tokens):
    body = {"s": 1, "ms": 0.0}
    if handles is not None:
        body["h"] = handles
    if tokens is not None:
        body["t"] = tokens
    return m.decode_result(Body("result", body))


def _reference(value, high):
    """What the general check (no unsigned fast test) answers, as body.ints would say it."""
    body = Body("result", {"x": value} if value is not None else {})
    try:
        present = body._get("x", False)
        return check_ints_general(present, 0, high, MAX_TOKENS_PER_MESSAGE,
                                  lambda rule: body.fail("x", rule))
    except ProtocolError as error:
        return error


@pytest.mark.parametrize("value", LISTS, ids=repr)
def test_the_fast_check_accepts_exactly_what_body_ints_accepts(value):
    for field, high in (("h", INT64[1]), ("t", MAX_TOKEN_ID)):
        other = [0] * len(value) if isinstance(value, list) else [0]
        expected = _reference(value, high)
        args = (value, other) if field == "h" else (other, value)
        try:
            got = getattr(_decode(*args), "handles" if field == "h" else "token_ids")
        except ProtocolError as error:
            assert isinstance(expected, ProtocolError), (field, value)
            assert str(error) == str(expected).replace("'x'", repr(field)), (field, value)
            continue
        assert not isinstance(expected, ProtocolError), (field, value)
        assert got == expected and got is value


def test_a_result_round_trips_through_the_fast_check():
    result = StepResult(4, list(range(256)), [(7 * i) % 32000 for i in range(256)])
    _, body = m.decode(m.encode_result(result), frozenset({"result"}))
    decoded = m.decode_result(body)
    assert (decoded.step_id, decoded.handles, decoded.token_ids) == (
        4, result.handles, result.token_ids)


# ---- the bench's repeated breakdown -----------------------------------------------------

def test_breakdown_repeated_reports_median_min_and_scheduler_own():
    rows = breakdown_repeated(4, repeats=3, steps=5)
    assert rows["repeats"] == 3
    for stat in ("median", "min"):
        stages = rows[stat]
        assert set(SCHEDULER_STAGES) <= set(stages)
        assert {"total", "scheduler own"} <= set(stages)
        assert all(value >= 0 for value in stages.values())
    assert all(rows["min"][name] <= rows["median"][name] for name in rows["min"])

def _two_updates(parent: bytes | None, token_ids: list[int]) -> bytes:
    digest = hashlib.sha256(parent or b"\x00" * 32)
    digest.update(struct.pack(f"<{len(token_ids)}q", *token_ids))
    return digest.digest()


def test_chain_hash_values_are_unchanged():
    rng = random.Random(7)
    parent = None
    for _ in range(400):
        count = rng.choice([0, 1, 4, 15, 16, 17, 32, rng.randrange(1, 300)])
        tokens = [rng.randrange(-2**63, 2**63) if rng.random() < 0.05
                  else rng.randrange(1 << 31) for _ in range(count)]
        assert chain_hash(parent, tokens) == _two_updates(parent, tokens)
        parent = None if rng.random() < 0.2 else _two_updates(parent, tokens)
    # Pinned (computed by the previous code): routers and schedulers of other builds agree.
    assert chain_hash(chain_hash(None, list(range(16))), [7] * 16).hex() == (
        "fa87c8f0ab10a20ad6b41acf2f76af43"
        "150552e7d925855223f45ebdda00bcad")


def test_chain_hash_packs_past_its_cache_of_lengths():
    for count in range(1, 100):   # more lengths than the packer cache holds
        tokens = list(range(count))
        assert chain_hash(b"\x01" * 32, tokens) == _two_updates(b"\x01" * 32, tokens)


@pytest.mark.parametrize("bad", [[2**63], [-2**63 - 1], [1.5], ["a"]])
def test_chain_hash_refuses_what_it_refused(bad):
    with pytest.raises(struct.error):
        chain_hash(None, bad)


def test_full_block_hashes_chain():
    tokens = list(range(50))
    hashes = full_block_hashes(tokens, 16, 8)
    assert len(hashes) == 3
    parent = None
    for index, value in enumerate(hashes):
        parent = _two_updates(parent, tokens[16 * index:16 * index + 16])
        assert value == parent


@pytest.mark.parametrize("reserve_null", [False, True])
def test_allocate_one_takes_what_allocate_takes(reserve_null):
    pools = [BlockPool(6, reserve_null), BlockPool(6, reserve_null)]
    for pool in pools:   # the same history: used, cached-free and free blocks
        blocks = pool.allocate(3)
        pool.register(blocks[0], b"a" * 32)
        pool.register(blocks[1], b"b" * 32)
        pool.release(blocks)
    one, many = pools
    while many.num_free:
        assert one.allocate_one() == many.allocate(1)[0]
        assert one.ref_counts() == many.ref_counts()
        assert one.num_cached_free == many.num_cached_free
        assert [one.block_hash(b) for b in range(6)] == [many.block_hash(b) for b in range(6)]
        assert one.lookup(b"a" * 32) == many.lookup(b"a" * 32)
    assert one.allocate_one() is None and one.num_free == 0


def test_allocate_slots_one_block_path():
    kv = KVCacheManager(SchedulerConfig(num_kv_blocks=3, block_size=4, max_num_seqs=4,
                                        max_num_batched_tokens=16, max_model_len=64,
                                        vocab_size=100))
    request = Request("r", 0, [1, 2, 3, 4], SamplingParams())
    assert len(kv.admit(request, CachedPrefix([], 0), 4, step=0)) == 1
    row = kv._tables[request.handle]   # the manager's own row: nothing else reads it
    request.num_computed_tokens = 4
    (block,) = kv.allocate_slots(request, 1, step=1)   # crosses into the second block
    assert kv.block_ids(request)[-1] == block and row.num_slots == 8
    request.num_computed_tokens = 8
    assert len(kv.allocate_slots(request, 1, step=2)) == 1   # the last free block
    request.num_computed_tokens = 12
    assert kv.allocate_slots(request, 1, step=3) is None     # none left: nothing changes
    assert len(kv.block_ids(request)) == 3 and row.num_slots == 12


def test_update_keeps_plain_tokens_aligned_with_their_ids():
    scheduler = Scheduler(SchedulerConfig(num_kv_blocks=64, block_size=4, max_num_seqs=8,
                                          max_num_batched_tokens=64, max_model_len=64,
                                          vocab_size=100, eos_token_ids=(99,)))
    for i in range(6):
        scheduler.add_request(f"r{i}", [1 + i, 2, 3], SamplingParams(max_tokens=20))
    plan = scheduler.schedule()
    handles = [new.handle for new in plan.new_requests]
    scheduler.update(plan, StepResult(plan.step_id, handles, [10] * len(handles)))
    scheduler.abort_request("r2")   # its handle still comes back in the next result
    scheduler.take_pending_outputs()
    plan = scheduler.schedule()
    tokens = [20 + i for i in range(len(handles))]
    tokens[4] = 99   # r4 stops on EOS: not plain
    outputs = scheduler.update(plan, StepResult(plan.step_id, handles, tokens))
    assert outputs.ids == ["r0", "r1", "r3", "r5"]
    assert outputs.tokens == [20, 21, 23, 25]
    assert [(o.request_id, o.new_token_ids) for o in outputs.entries] == [("r4", [99])]


def test_new_block_ids_encode_to_the_same_bytes():
    plan = StepPlan(3, running_handles=[1, 2, 3], running_num_tokens=[1, 1, 2],
                    new_block_ids={1: [5], 3: [7, 8]})
    expected = msgpack.packb([PROTOCOL_VERSION, "plan", {
        "s": 3, "h": [1, 2, 3], "k": [1, 1, 2], "b": [[1, [5]], [3, [7, 8]]]}],
        use_bin_type=True)
    assert m.encode_plan(plan) == expected
