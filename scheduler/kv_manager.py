"""Block tables over the device BlockPool and the CPU SwapSpace. KVCacheManager is the only
writer of a request's block_ids, num_registered, num_freed_blocks, block_hashes and
cpu_block_ids, and of the two counts cached from them for the scheduler's per-step loops
(num_slots, register_at: see _retable; PrefixCache, its helper, keeps register_at when it
moves num_registered): the scheduler works in token counts ("slots for this request's next k
tokens?") and hands back what it was given (prefix hits) or puts it in the plan (copy and
swap pairs) without looking inside.

A block is taken only when a token needs a slot; full blocks are registered in the prefix
cache and found again by later requests (scheduler/prefix_cache.py).

Sliding window (every layer windowed, the largest window W): a token at position p reads
keys p - W < j <= p, so once a request's next token is at p, its blocks wholly before
p - W + 1 are read by no layer again. They are released (a registered one stays findable
as cached-free) and their table entries name the pool's null block: the table keeps its
length, so positions still map to entries, and the freed entries are always the leading
ones (request.num_freed_blocks)."""

from __future__ import annotations

from folio.scheduler.block_pool import BlockPool
from folio.scheduler.prefix_cache import PrefixCache
from folio.scheduler.request import NEVER, Request
from folio.scheduler.swap_space import SwapSpace
from folio.shared.config import SchedulerConfig


class KVCacheManager:
    def __init__(self, config: SchedulerConfig) -> None:
        window = config.sliding_window
        self.pool = BlockPool(config.num_kv_blocks, reserve_null=window is not None)
        self.swap = SwapSpace(config.num_swap_blocks)
        self.block_size = config.block_size
        self.sliding_window = window
        self.window_peak_blocks = config.window_peak_blocks
        self.prefix = PrefixCache(self.pool, config.block_size, config.enable_prefix_caching,
                                  self.dead_blocks if window is not None else None)
        self._copies: list[tuple[int, int]] = []   # fork copies not yet in a plan
        # register_full_blocks without its test, for the scheduler's per-request loops,
        # which test num_tokens >= request.register_at in line: one call, not two.
        self.register_filled = self.prefix.register

    # ---- counts -------------------------------------------------------------------------

    @property
    def num_free_swap_blocks(self) -> int:
        return self.swap.num_free

    def blocks_for(self, num_tokens: int) -> int:
        return -(-num_tokens // self.block_size)

    def live_blocks(self, request: Request) -> list[int]:
        """The request's table without its freed entries."""
        return request.block_ids[request.num_freed_blocks:]

    def stats(self, running: list[Request]) -> dict[str, int | float]:
        pool, swap = self.pool, self.swap.pool
        return {
            "kv_blocks_total": pool.num_usable,
            "kv_blocks_free": pool.num_free,
            "kv_blocks_used": pool.num_used,
            "kv_blocks_cached": pool.num_cached_free,
            "kv_slot_utilization": self.slot_utilization(running),
            "swap_blocks_total": swap.num_blocks,
            "swap_blocks_free": swap.num_free,
        }

    def slot_utilization(self, running: list[Request]) -> float:
        """Fraction of the slots in used blocks that hold a computed token."""
        size = self.block_size
        filled: dict[int, int] = {}
        for request in running:
            computed = request.num_computed_tokens
            first = request.num_freed_blocks
            for index, block_id in enumerate(request.block_ids[first:], first):
                tokens = min(size, max(0, computed - index * size))
                filled[block_id] = max(filled.get(block_id, 0), tokens)
        slots = len(filled) * size
        return sum(filled.values()) / slots if slots else 1.0

    # ---- slots --------------------------------------------------------------------------

    def allocate_slots(self, request: Request, num_new_tokens: int) -> list[int] | None:
        """Slots for the request's next `num_new_tokens` tokens after its computed ones.
        Blocks behind the window of the first of them are released first. Returns the
        blocks appended to its table ([] when the last block has room), or None, appending
        nothing, when the pool is short."""
        first = request.num_computed_tokens
        if self.sliding_window is not None:
            self._free_outside_window(request, first)
        end = first + num_new_tokens
        slots = request.num_slots
        if end <= slots:
            return []   # the common decode case: the last block still has room
        table = request.block_ids
        size = self.block_size
        if end <= slots + size:   # one block more: a decode step that crossed into it
            block_id = self.pool.allocate_one()
            if block_id is None:
                return None
            table.append(block_id)
            request.num_slots = slots + size
            return [block_id]
        missing = -(-end // size) - len(table)
        pool = self.pool
        if missing > pool.num_free:
            return None
        new_blocks = pool.allocate(missing)
        table.extend(new_blocks)
        request.num_slots = len(table) * size
        return new_blocks

    def free(self, request: Request) -> None:
        """Release every block the request holds, on the device and in the swap space."""
        self.pool.release(request.block_ids)   # the null entries are skipped
        request.block_ids = []
        request.num_registered = 0
        request.num_freed_blocks = 0
        self._retable(request)
        if request.cpu_block_ids:
            self.swap.drop(request)

    # ---- admission ----------------------------------------------------------------------

    def find_cached_prefix(self, request: Request) -> list[int]:
        """Blocks already holding the request's leading full blocks (pass them to can_admit
        and admit; they count len(hits) * block_size computed tokens)."""
        return self.prefix.find(request)

    def can_admit(self, request: Request, hits: list[int]) -> bool:
        """Whether the pool holds the blocks of the whole request after the hits (with a
        window: at most its peak footprint)."""
        needed = self.blocks_for(request.num_tokens) - len(hits)
        kept = hits
        if self.sliding_window is not None:
            # Hits behind the first new token's window are released right after sharing;
            # the request never holds more than the window's peak.
            kept = hits[self.dead_blocks(len(hits) * self.block_size):]
            needed = min(needed, self.window_peak_blocks - len(kept))
        refs = self.pool.ref_count
        reclaimable = sum(1 for b in kept if refs(b) == 0)   # cached-free: counted as free
        return needed <= self.pool.num_free - reclaimable

    def admit(self, request: Request, hits: list[int], num_new_tokens: int) -> list[int]:
        """Start the request's table from the hits (request.num_computed_tokens already
        counts them) with slots for `num_new_tokens` more; can_admit said they fit."""
        for block_id in hits:
            self.pool.share(block_id)
        request.block_ids = list(hits)
        request.num_registered = len(hits)
        self._retable(request)
        new_blocks = self.allocate_slots(request, num_new_tokens)
        assert new_blocks is not None, "admission checked the free blocks"
        return new_blocks

    # ---- n > 1 --------------------------------------------------------------------------

    def fork(self, parent: Request, child: Request) -> bool:
        """Give `child` the parent's prompt minus its last token: the full blocks shared by
        reference, the partial one copied (the copy goes into the next plan, take_copies).
        False, changing nothing, when no block is free or (sliding window) the parent
        already freed a block the child's last prompt token reads."""
        prompt_len = len(parent.prompt_token_ids)
        shared = (prompt_len - 1) // self.block_size   # full blocks before the last token
        dead = self.dead_blocks(prompt_len - 1)
        if self.pool.num_free < 1 or parent.num_freed_blocks > dead:
            return False
        table = parent.block_ids
        for block_id in table[dead:shared]:
            self.pool.share(block_id)
        (copy,) = self.pool.allocate(1)
        self._copies.append((table[shared], copy))
        child.block_ids = [self.pool.null_block] * dead + table[dead:shared] + [copy]
        child.num_freed_blocks = dead
        child.block_hashes = list(parent.block_hashes[:shared])
        child.num_registered = shared
        self._retable(child)
        return True

    def take_copies(self) -> list[tuple[int, int]]:
        """The (source, destination) block copies forks made since the last call."""
        copies, self._copies = self._copies, []
        return copies

    # ---- swap ---------------------------------------------------------------------------

    def swap_out(self, request: Request) -> list[tuple[int, int]]:
        """Move the request's live blocks to the swap space (the caller checked
        num_free_swap_blocks) and release them; returns the (device, CPU) pairs to copy.
        The count of freed entries stays, so swap_in restores them as null entries."""
        pairs = self.swap.store(request, self.live_blocks(request))
        self.pool.release(request.block_ids)
        request.block_ids = []
        request.num_registered = 0
        self._retable(request)
        return pairs

    def swap_in(self, request: Request, num_new_tokens: int) -> list[tuple[int, int]] | None:
        """Device blocks for a swapped-out request's computed tokens and `num_new_tokens`
        more; returns the (CPU, device) pairs to copy, or None, changing nothing, when the
        pool is short."""
        freed = request.num_freed_blocks   # entries that left the window stay null
        needed = self.blocks_for(request.num_computed_tokens + num_new_tokens) - freed
        if needed > self.pool.num_free:
            return None
        device_blocks = self.pool.allocate(needed)
        pairs = self.swap.load(request, device_blocks)
        request.block_ids = ([self.pool.null_block] * freed + device_blocks if freed
                             else device_blocks)
        self._retable(request)
        return pairs

    def _retable(self, request: Request) -> None:
        """Cache what the scheduler's per-step loops test, after block_ids or
        num_registered changed: the slots the table holds, and the token count at which a
        block fills that the prefix cache has not registered (NEVER with it off)."""
        size = self.block_size
        request.num_slots = len(request.block_ids) * size
        request.register_at = ((request.num_registered + 1) * size if self.prefix.enabled
                               else NEVER)

    # ---- prefix cache -------------------------------------------------------------------

    def register_full_blocks(self, request: Request, num_tokens: int, step: int) -> None:
        """Make the full blocks among the request's first `num_tokens` tokens findable,
        unconfirmed until step `step`'s result arrives (confirm_through)."""
        # Cheap test first: most decode steps fill no block.
        if num_tokens >= request.register_at:
            self.prefix.register(request, num_tokens, step)

    def confirm_through(self, step: int) -> None:
        """Steps up to `step` ran: their blocks hold what their hashes say."""
        self.prefix.confirm_through(step)

    def discard_unconfirmed(self, running: list[Request]) -> None:
        """A step failed: no later request may find the blocks registered for steps that
        never returned (they may hold garbage)."""
        self.prefix.discard_unconfirmed(running)

    def unconfirmed_blocks(self) -> set[int]:
        return self.prefix.unconfirmed_blocks()

    # ---- sliding window -----------------------------------------------------------------

    def dead_blocks(self, first_position: int) -> int:
        """Leading blocks no layer reads once the next token computed is at first_position."""
        if self.sliding_window is None:
            return 0
        return max(0, first_position - self.sliding_window + 1) // self.block_size

    def _free_outside_window(self, request: Request, first_position: int) -> None:
        dead = min(self.dead_blocks(first_position), len(request.block_ids))
        start = request.num_freed_blocks
        if dead <= start:
            return
        table = request.block_ids
        self.pool.release(table[start:dead])
        null = self.pool.null_block
        for index in range(start, dead):
            table[index] = null
        request.num_freed_blocks = dead
