"""KVCacheManager's public methods on their own: every round trip (allocate, admit with
prefix hits, fork, swap out and in) ends with both pools whole once the requests are freed,
a call that does not fit changes nothing, and the tables are read through the manager's
named methods (block_ids, num_freed_blocks, swap_block_ids), never on the request."""

from __future__ import annotations

import itertools

import pytest

from folio.scheduler.kv.block_pool import OutOfBlocks
from folio.scheduler.kv.kv_manager import KVCacheManager
from folio.scheduler.kv.prefix_cache import CachedPrefix
from folio.scheduler.request import Request
from folio.shared.config import SchedulerConfig
from folio.shared.sampling_params import SamplingParams

SIZE = 4
NO_HITS = CachedPrefix([], 0)
HANDLES = itertools.count()   # the manager keys tables by handle: one each, as a Scheduler


def manager(num_blocks: int = 8, num_swap_blocks: int = 8, **config) -> KVCacheManager:
    return KVCacheManager(SchedulerConfig(
        num_kv_blocks=num_blocks, block_size=SIZE, max_model_len=64,
        max_num_batched_tokens=64, num_swap_blocks=num_swap_blocks, **config))


def request(prompt_len: int, name: str = "r", start: int = 0) -> Request:
    return Request(name, next(HANDLES), list(range(start, start + prompt_len)),
                   SamplingParams())


def assert_whole(kv: KVCacheManager) -> None:
    assert kv.pool.num_free == kv.pool.num_usable
    assert kv.pool.num_used == 0
    assert kv.num_free_swap_blocks == kv.swap.pool.num_blocks
    assert kv.take_copies() == []


def snapshot(kv: KVCacheManager, *requests: Request) -> tuple:
    return (kv.pool.ref_counts(), kv.pool.num_free, kv.swap.pool.ref_counts(),
            [(kv.block_ids(r), kv.num_freed_blocks(r), kv.swap_block_ids(r)) for r in requests])


def test_allocate_slots_grows_by_blocks_and_free_returns_them():
    kv = manager()
    r = request(6)
    kv.admit(r, NO_HITS, 4, step=0)
    assert len(kv.block_ids(r)) == 1
    r.num_computed_tokens = 4
    assert len(kv.allocate_slots(r, 2, step=1)) == 1
    r.num_computed_tokens = 6
    assert not kv.allocate_slots(r, 2, step=2)    # the last block still has room
    r.num_computed_tokens = 8
    (new,) = kv.allocate_slots(r, 1, step=3)
    assert kv.block_ids(r)[-1] == new and len(kv.block_ids(r)) == 3
    kv.free(r)
    assert kv.block_ids(r) == []
    assert_whole(kv)


def test_a_failed_allocation_allocates_nothing():
    kv = manager(num_blocks=4)
    holder, r = request(8, "holder"), request(4)
    kv.admit(holder, NO_HITS, 8, step=0)
    kv.admit(r, NO_HITS, 4, step=0)
    r.num_computed_tokens = 4
    before = snapshot(kv, holder, r)
    assert kv.allocate_slots(r, 9, step=1) is None   # needs 3 more, 1 free
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
    assert kv.find_cached_prefix(first) == NO_HITS
    assert kv.can_admit(first, NO_HITS)
    kv.admit(first, NO_HITS, 10, step=0)          # registers its two full blocks
    assert kv.unconfirmed_blocks() == set(kv.block_ids(first)[:2])
    kv.confirm_through(0)
    assert kv.unconfirmed_blocks() == set()

    cached = kv.find_cached_prefix(second)
    assert cached == (kv.block_ids(first)[:2], 2 * SIZE)
    second.num_computed_tokens = cached.num_tokens
    new = kv.admit(second, cached, 2, step=1)
    assert kv.block_ids(second) == cached.blocks + new
    assert [kv.pool.ref_count(b) for b in cached.blocks] == [2, 2]
    kv.forget(first)
    kv.forget(second)
    assert kv.pool.num_cached_free == 2           # findable, yet counted free
    assert_whole(kv)


def test_can_admit_refuses_what_does_not_fit_and_changes_nothing():
    kv = manager(num_blocks=3)
    holder, r = request(8, "holder"), request(9, start=100)
    kv.admit(holder, NO_HITS, 8, step=0)
    before = snapshot(kv, holder, r)
    assert not kv.can_admit(r, kv.find_cached_prefix(r))
    assert snapshot(kv, holder, r) == before
    kv.free(holder)
    assert kv.can_admit(r, NO_HITS)


def test_register_full_blocks_registers_a_block_once_its_tokens_are_known():
    """One step ahead: the step computing a block's last token is planned before that
    token is known; the block is registered when it arrives."""
    kv = manager(enable_prefix_caching=True)
    r = request(7)
    kv.admit(r, NO_HITS, 7, step=0)               # one full block; 3 tokens of the second
    r.num_computed_tokens = 7
    kv.allocate_slots(r, 1, step=1)               # the 8th token: not known yet
    assert len(kv.block_hashes(r)) == 1
    r.output_token_ids.append(42)
    r.num_tokens += 1
    kv.register_full_blocks(r, 8, step=1)
    assert len(kv.block_hashes(r)) == 2
    assert kv.unconfirmed_blocks() == set(kv.block_ids(r))
    kv.forget(r)
    assert_whole(kv)


def test_discard_unconfirmed_forgets_the_blocks_and_rewinds_the_table():
    kv = manager(enable_prefix_caching=True)
    r = request(12)
    kv.admit(r, NO_HITS, 12, step=5)
    assert len(kv.unconfirmed_blocks()) == 3
    kv.discard_unconfirmed()
    assert not kv.unconfirmed_blocks()
    assert kv.find_cached_prefix(request(12, "later")) == NO_HITS
    r.num_computed_tokens = 12
    kv.register_full_blocks(r, 12, step=6)        # rewound: registers them again
    assert len(kv.unconfirmed_blocks()) == 3
    kv.discard_unconfirmed()
    kv.forget(r)
    assert kv.pool.num_cached_free == 0
    assert_whole(kv)


def test_fork_shares_full_blocks_and_copies_the_partial_one():
    kv = manager()
    parent, child = request(10, "p"), request(10, "c")
    kv.admit(parent, NO_HITS, 10, step=0)
    assert kv.fork(parent, child)
    table, child_table = kv.block_ids(parent), kv.block_ids(child)
    copy = child_table[-1]
    assert child_table[:2] == table[:2] and copy not in table
    assert kv.block_hashes(child) == kv.block_hashes(parent)[:2]
    assert kv.take_copies() == [(table[2], copy)]
    assert [kv.pool.ref_count(b) for b in table] == [2, 2, 1]
    kv.forget(parent)
    kv.forget(child)
    assert_whole(kv)


def test_a_fork_that_does_not_fit_changes_nothing():
    kv = manager(num_blocks=3)
    parent, child = request(10, "p"), request(10, "c")
    kv.admit(parent, NO_HITS, 10, step=0)
    before = snapshot(kv, parent, child)
    assert not kv.fork(parent, child)
    assert snapshot(kv, parent, child) == before and kv.take_copies() == []
    kv.free(parent)
    assert_whole(kv)


def test_swap_out_and_in_pair_the_same_blocks():
    kv = manager()
    r = request(10)
    kv.admit(r, NO_HITS, 10, step=0)
    r.num_computed_tokens = 10
    device = kv.block_ids(r)
    assert kv.num_live_blocks(r) == 3
    out = kv.swap_out(r)
    assert [d for d, _ in out] == device and [c for _, c in out] == kv.swap_block_ids(r)
    assert kv.block_ids(r) == [] and kv.pool.num_used == 0
    assert kv.num_free_swap_blocks == kv.swap.pool.num_blocks - 3
    back = kv.swap_in(r, 3, step=1)               # 13 tokens: a fourth block, not copied
    assert [c for c, _ in back] == [c for _, c in out]
    table = kv.block_ids(r)
    assert [d for _, d in back] == table[:3] and len(table) == 4
    assert kv.swap_block_ids(r) == []
    kv.free(r)
    assert_whole(kv)


def test_a_swap_in_that_does_not_fit_changes_nothing():
    kv = manager(num_blocks=4)
    r, other = request(10), request(8, "other")
    kv.admit(r, NO_HITS, 10, step=0)
    r.num_computed_tokens = 10
    kv.swap_out(r)
    kv.admit(other, NO_HITS, 8, step=0)
    before = snapshot(kv, r, other)
    assert kv.swap_in(r, 1, step=1) is None
    assert snapshot(kv, r, other) == before
    kv.free(r)                                    # a swapped request frees its swap blocks
    kv.free(other)
    assert_whole(kv)


def test_sliding_window_frees_into_the_null_block_and_swaps_only_live_blocks():
    kv = manager(sliding_window=3)
    null = kv.pool.null_block
    r = request(12)
    kv.admit(r, NO_HITS, 12, step=0)
    r.num_computed_tokens = 12
    kv.allocate_slots(r, 1, step=1)               # reads keys 10..12: blocks 0 and 1 are dead
    table = kv.block_ids(r)
    assert table[:2] == [null, null] and kv.num_freed_blocks(r) == 2
    assert kv.num_live_blocks(r) == 2
    out = kv.swap_out(r)
    assert [d for d, _ in out] == table[2:] and kv.num_freed_blocks(r) == 2
    kv.swap_in(r, 1, step=2)
    table = kv.block_ids(r)
    assert table[:2] == [null, null] and len(table) == 4
    kv.free(r)
    assert kv.num_freed_blocks(r) == 0
    assert_whole(kv)


def test_forget_drops_the_table_and_the_hashes():
    kv = manager(enable_prefix_caching=True)
    r = request(9)
    kv.admit(r, NO_HITS, 9, step=0)
    kv.free(r)                                    # preempted to be recomputed
    assert kv.block_ids(r) == [] and len(kv.block_hashes(r)) == 2   # hashes stay
    kv.forget(r)                                  # finished
    assert kv.block_hashes(r) == [] and kv.handles() == set()
    assert_whole(kv)
