"""KVCacheManager's public methods on their own: every round trip (allocate, admit with
prefix hits, fork, swap out and in) ends with both pools whole once the requests are freed,
and a call that does not fit changes nothing."""

from __future__ import annotations

import pytest

from folio.scheduler.block_pool import OutOfBlocks
from folio.scheduler.kv_manager import KVCacheManager
from folio.scheduler.request import Request
from folio.shared.config import SchedulerConfig
from folio.shared.sampling_params import SamplingParams

SIZE = 4


def manager(num_blocks: int = 8, num_swap_blocks: int = 8, **config) -> KVCacheManager:
    return KVCacheManager(SchedulerConfig(
        num_kv_blocks=num_blocks, block_size=SIZE, max_model_len=64,
        max_num_batched_tokens=64, num_swap_blocks=num_swap_blocks, **config))


def request(prompt_len: int, name: str = "r", start: int = 0) -> Request:
    return Request(name, 0, list(range(start, start + prompt_len)), SamplingParams())


def assert_whole(kv: KVCacheManager) -> None:
    assert kv.pool.num_free == kv.pool.num_usable
    assert kv.pool.num_used == 0
    assert kv.num_free_swap_blocks == kv.swap.pool.num_blocks
    assert kv.take_copies() == []


def snapshot(kv: KVCacheManager, *requests: Request) -> tuple:
    return (kv.pool.ref_counts(), kv.pool.num_free, kv.swap.pool.ref_counts(),
            [(list(r.block_ids), r.num_registered, r.num_freed_blocks, list(r.cpu_block_ids))
             for r in requests])


def test_allocate_slots_grows_by_blocks_and_free_returns_them():
    kv = manager()
    r = request(6)
    assert len(kv.allocate_slots(r, 6)) == 2
    r.num_computed_tokens = 6
    assert kv.allocate_slots(r, 2) == []          # the last block still has room
    r.num_computed_tokens = 8
    (new,) = kv.allocate_slots(r, 1)
    assert r.block_ids[-1] == new and len(r.block_ids) == 3
    kv.free(r)
    assert r.block_ids == [] and r.num_registered == 0
    assert_whole(kv)


def test_a_failed_allocation_allocates_nothing():
    kv = manager(num_blocks=4)
    holder, r = request(8, "holder"), request(4)
    kv.allocate_slots(holder, 8)
    kv.allocate_slots(r, 4)
    r.num_computed_tokens = 4
    before = snapshot(kv, holder, r)
    assert kv.allocate_slots(r, 9) is None        # needs 3 more, 1 free
    assert snapshot(kv, holder, r) == before
    kv.free(holder)
    kv.free(r)
    assert_whole(kv)


def test_pool_allocate_past_free_is_a_bug_and_takes_nothing():
    kv = manager(num_blocks=2)
    with pytest.raises(OutOfBlocks):
        kv.pool.allocate(3)
    assert kv.pool.num_free == 2


def test_admit_shares_registered_prefix_and_frees_whole():
    kv = manager(enable_prefix_caching=True)
    first, second = request(10, "a"), request(10, "b")
    assert kv.find_cached_prefix(first) == []
    assert kv.can_admit(first, [])
    kv.admit(first, [], 10)
    kv.register_full_blocks(first, 10, step=0)
    assert kv.unconfirmed_blocks() == set(first.block_ids[:2])
    kv.confirm_through(0)
    assert kv.unconfirmed_blocks() == set()

    hits = kv.find_cached_prefix(second)
    assert hits == first.block_ids[:2]
    second.num_computed_tokens = len(hits) * SIZE
    new = kv.admit(second, hits, 2)
    assert second.block_ids == hits + new and second.num_registered == 2
    assert [kv.pool.ref_count(b) for b in hits] == [2, 2]
    kv.free(first)
    kv.free(second)
    assert kv.pool.num_cached_free == 2           # findable, yet counted free
    assert_whole(kv)


def test_can_admit_refuses_what_does_not_fit_and_changes_nothing():
    kv = manager(num_blocks=3)
    holder, r = request(8, "holder"), request(9)
    kv.admit(holder, [], 8)
    before = snapshot(kv, holder, r)
    assert not kv.can_admit(r, kv.find_cached_prefix(r))
    assert snapshot(kv, holder, r) == before
    kv.free(holder)
    assert kv.can_admit(r, [])


def test_discard_unconfirmed_forgets_the_blocks_and_rewinds_the_table():
    kv = manager(enable_prefix_caching=True)
    r = request(12)
    kv.admit(r, [], 12)
    kv.register_full_blocks(r, 12, step=5)
    assert r.num_registered == 3
    kv.discard_unconfirmed([r])
    assert r.num_registered == 0 and not kv.unconfirmed_blocks()
    assert kv.find_cached_prefix(request(12, "later")) == []
    kv.free(r)
    assert kv.pool.num_cached_free == 0
    assert_whole(kv)


def test_fork_shares_full_blocks_and_copies_the_partial_one():
    kv = manager()
    parent, child = request(10, "p"), request(10, "c")
    kv.admit(parent, [], 10)
    assert kv.fork(parent, child)
    copy = child.block_ids[-1]
    assert child.block_ids[:2] == parent.block_ids[:2] and copy not in parent.block_ids
    assert child.num_registered == 2
    assert kv.take_copies() == [(parent.block_ids[2], copy)]
    assert [kv.pool.ref_count(b) for b in parent.block_ids] == [2, 2, 1]
    kv.free(parent)
    kv.free(child)
    assert_whole(kv)


def test_a_fork_that_does_not_fit_changes_nothing():
    kv = manager(num_blocks=3)
    parent, child = request(10, "p"), request(10, "c")
    kv.admit(parent, [], 10)
    before = snapshot(kv, parent, child)
    assert not kv.fork(parent, child)
    assert snapshot(kv, parent, child) == before and kv.take_copies() == []
    kv.free(parent)
    assert_whole(kv)


def test_swap_out_and_in_pair_the_same_blocks():
    kv = manager()
    r = request(10)
    kv.admit(r, [], 10)
    r.num_computed_tokens = 10
    device = list(r.block_ids)
    out = kv.swap_out(r)
    assert [d for d, _ in out] == device and [c for _, c in out] == r.cpu_block_ids
    assert r.block_ids == [] and kv.pool.num_used == 0
    assert kv.num_free_swap_blocks == kv.swap.pool.num_blocks - 3
    back = kv.swap_in(r, 3)                       # 13 tokens: a fourth block, not copied
    assert [c for c, _ in back] == [c for _, c in out]
    assert [d for _, d in back] == r.block_ids[:3] and len(r.block_ids) == 4
    assert r.cpu_block_ids == []
    kv.free(r)
    assert_whole(kv)


def test_a_swap_in_that_does_not_fit_changes_nothing():
    kv = manager(num_blocks=4)
    r, other = request(10), request(8, "other")
    kv.admit(r, [], 10)
    r.num_computed_tokens = 10
    kv.swap_out(r)
    kv.admit(other, [], 8)
    before = snapshot(kv, r, other)
    assert kv.swap_in(r, 1) is None
    assert snapshot(kv, r, other) == before
    kv.free(r)                                    # a swapped request frees its swap blocks
    kv.free(other)
    assert_whole(kv)


def test_sliding_window_frees_into_the_null_block_and_swaps_only_live_blocks():
    kv = manager(sliding_window=3)
    null = kv.pool.null_block
    r = request(12)
    kv.admit(r, [], 12)
    r.num_computed_tokens = 12
    kv.allocate_slots(r, 1)                       # reads keys 10..12: blocks 0 and 1 are dead
    assert r.block_ids[:2] == [null, null] and r.num_freed_blocks == 2
    assert kv.live_blocks(r) == r.block_ids[2:]
    out = kv.swap_out(r)
    assert len(out) == 2 and r.num_freed_blocks == 2
    kv.swap_in(r, 1)
    assert r.block_ids[:2] == [null, null] and len(r.block_ids) == 4
    kv.free(r)
    assert r.num_freed_blocks == 0
    assert_whole(kv)
