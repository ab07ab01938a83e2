"""The second round of per-step fast paths (issue 13 item 2) changes no value and no byte.

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

from scheduler.block_pool import BlockPool
from scheduler.kv_manager import KVCacheManager
from scheduler.request import Request
from scheduler.scheduler import Scheduler
from shared import messages as m
from shared.config import SchedulerConfig
from shared.prefix_hash import chain_hash, full_block_hashes
from shared.sampling_params import SamplingParams
from shared.step import StepPlan, StepResult
from shared.wire import PROTOCOL_VERSION


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
    assert len(kv.admit(request, [], 4)) == 1
    request.num_computed_tokens = 4
    (block,) = kv.allocate_slots(request, 1)           # crosses into the second block
    assert request.block_ids[-1] == block and request.num_slots == 8
    request.num_computed_tokens = 8
    assert len(kv.allocate_slots(request, 1)) == 1     # the last free block
    request.num_computed_tokens = 12
    assert kv.allocate_slots(request, 1) is None       # none left: nothing changes
    assert len(request.block_ids) == 3 and request.num_slots == 12


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
