"""Block tables over the device BlockPool and the CPU SwapSpace. KVCacheManager holds every
request's table (scheduler/kv/block_table.py: device block ids, swap block ids, the prefix
cache's progress, the counts cached from them) and alone writes it. The scheduler works in
token counts and asks ("slots for this request's next k tokens?", "its table, for the
plan"); it hands back what it was given (a cached prefix) or puts it in the plan (copy and
swap pairs) without looking inside. The page map and the tests read a table through the
same small methods (block_ids, num_freed_blocks, swap_block_ids).

A table lives from a request's first admission (or fork) until forget; a preemption by
recompute empties it, a swap-out keeps only its swap blocks.

A block is taken only when a token needs a slot; full blocks are registered in the prefix
cache and found again by later requests (scheduler/kv/prefix_cache.py, which keeps the
requests' hash chains).

Sliding window (every layer windowed, the largest window W): a token at position p reads
keys p - W < j <= p, so once a request's next token is at p, its blocks wholly before
p - W + 1 are read by no layer again. They are released (a registered one stays findable
as cached-free) and their table entries name the pool's null block: the table keeps its
length, so positions still map to entries, and the freed entries are always the leading
ones (num_freed_blocks).

Hybrid models (config.num_state_slots > 0): besides its blocks (the attention layers' KV),
each admitted request holds one recurrent state slot (scheduler/kv/state_slots.py) covering
every linear-attention / convolution layer. Admission needs a free slot as well as blocks;
free (recompute preemption) and forget give it back. A swap-out moves the state with the
blocks into a host state slot (config.num_swap_state_slots; none free: recompute) and gives
the device slot back; swap-in takes a device slot again (the plan's `state_swap_out` and
`state_swap_in`, moved in the blocks' order). Such a request is never forked (the child
would need the state one token before the parent's: it computes its prompt itself), and
the prefix cache works through state checkpoints: every config.hybrid_checkpoint_blocks
blocks of a sequence the executor copies its state into a spare slot, keyed by the hash of
the block ending there (the plan's `checkpoints`), and a request sharing the prefix takes
its blocks up to the deepest checkpoint it shares and starts its own slot as a copy of it
(the plan's `state_copies`). With hybrid_checkpoint_blocks 0 the prefix cache is off for
hybrids: a recurrent state cannot resume from shared blocks alone."""

from __future__ import annotations

from folio.scheduler.kv.block_pool import BlockPool
from folio.scheduler.kv.block_table import NEVER, BlockTable
from folio.scheduler.kv_events import KVEventLog
from folio.scheduler.kv.prefix_cache import (CachedPrefix, PrefixCache, ResumedPrefix,
                                          checkpoint_slot)
from folio.scheduler.request import Request
from folio.scheduler.kv.state_slots import StateSlots
from folio.scheduler.kv.swap_space import SwapSpace
from folio.shared.config import SchedulerConfig


class KVCacheManager:
    def __init__(self, config: SchedulerConfig, events: KVEventLog | None = None) -> None:
        window = config.sliding_window
        self.pool = BlockPool(config.num_kv_blocks, reserve_null=window is not None,
                              events=events)
        self.swap = SwapSpace(config.num_swap_blocks, config.num_swap_state_slots)
        self.block_size = config.block_size
        self.sliding_window = window
        self.window_peak_blocks = config.window_peak_blocks
        # A hybrid model's state resumes only from checkpoints: without them, no cache.
        self.checkpoint_span = (config.hybrid_checkpoint_blocks * config.block_size
                                if config.num_state_slots else 0)
        caching = config.enable_prefix_caching and (
            not config.num_state_slots or self.checkpoint_span > 0)
        self.prefix = PrefixCache(self.pool, config.block_size, caching,
                                  self.dead_blocks if window is not None else None)
        self._tables: dict[int, BlockTable] = {}   # by request handle
        self._copies: list[tuple[int, int]] = []   # fork copies not yet in a plan
        self.states = StateSlots(config.num_state_slots, config.state_bytes)
        self._state_copies: list[tuple[int, int]] = []      # (checkpoint, slot): next plan
        self._checkpoints: list[tuple[int, int, int]] = []  # (handle, tokens, slot): same
        self._state_swaps: tuple[list[tuple[int, int]], list[tuple[int, int]]] = ([], [])

    # ---- counts -------------------------------------------------------------------------

    @property
    def num_free_swap_blocks(self) -> int:
        return self.swap.num_free

    @property
    def num_free_swap_state_slots(self) -> int:
        return self.swap.num_free_state_slots

    def blocks_for(self, num_tokens: int) -> int:
        return -(-num_tokens // self.block_size)

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
            **({"state_slots_total": self.states.num_slots,
                "state_slots_used": self.states.num_used,
                "state_checkpoints": self.states.num_checkpoints,
                "swap_state_slots_total": self.swap.num_state_slots,
                "swap_state_slots_free": self.swap.num_free_state_slots}
               if self.states.enabled else {}),
        }

    def slot_utilization(self, running: list[Request]) -> float:
        """Fraction of the slots in used blocks that hold a computed token."""
        size = self.block_size
        filled: dict[int, int] = {}
        for request in running:
            computed = request.num_computed_tokens
            table = self._tables[request.handle]
            first = table.num_freed
            for index, block_id in enumerate(table.block_ids[first:], first):
                tokens = min(size, max(0, computed - index * size))
                filled[block_id] = max(filled.get(block_id, 0), tokens)
        slots = len(filled) * size
        return sum(filled.values()) / slots if slots else 1.0

    # ---- a request's table, read ------------------------------------------------------

    def block_ids(self, request: Request) -> list[int]:
        """The request's device table in reading order (a copy; [] while it holds none).
        The first num_freed_blocks entries name the null block."""
        table = self._tables.get(request.handle)
        return list(table.block_ids) if table is not None else []

    def num_freed_blocks(self, request: Request) -> int:
        """Leading entries freed behind a sliding window (kept while swapped out)."""
        table = self._tables.get(request.handle)
        return table.num_freed if table is not None else 0

    def num_live_blocks(self, request: Request) -> int:
        """Device blocks the request holds: what a swap-out copies."""
        table = self._tables[request.handle]
        return len(table.block_ids) - table.num_freed

    def state_slot(self, request: Request) -> int:
        """The request's recurrent state slot (-1: none held, or not a hybrid model)."""
        table = self._tables.get(request.handle)
        slot = table.state_slot if table is not None else None
        return -1 if slot is None else slot

    def swap_state_slot(self, request: Request) -> int:
        """The host state slot holding the request's state while swapped out (-1: none)."""
        table = self._tables.get(request.handle)
        slot = table.cpu_state_slot if table is not None else None
        return -1 if slot is None else slot

    def swap_block_ids(self, request: Request) -> list[int]:
        """The CPU blocks holding the request's live blocks while swapped out (a copy)."""
        table = self._tables.get(request.handle)
        return list(table.cpu_block_ids) if table is not None else []

    def block_hashes(self, request: Request) -> list[bytes]:
        """Prefix hashes of the request's full blocks, in order (a copy)."""
        return self.prefix.block_hashes(request)

    def handles(self) -> set[int]:
        """The handles of the requests it holds a table or a hash chain for (until forget)."""
        return self._tables.keys() | self.prefix.handles()

    # ---- slots --------------------------------------------------------------------------

    def begin_step(self, step: int) -> None:
        """Step `step` is being planned: a hybrid's checkpoints of earlier steps may be
        resumed from in it, its own not (they are written during its forward pass)."""
        self.states.begin_step(step)

    def allocate_slots(self, request: Request, num_new_tokens: int, step: int
                       ) -> list[int] | tuple[()] | None:
        """Slots for the request's next `num_new_tokens` tokens after its computed ones,
        which step `step` computes: blocks behind the window of the first of them are
        released first, and the full blocks among them become findable (unconfirmed until
        the step's result). Returns the blocks appended to its table (empty when the last
        block has room), or None, changing nothing, when the pool is short. The scheduler
        calls it for every running request every step: the common case costs one lookup
        and one compare."""
        table = self._tables[request.handle]
        end = request.num_computed_tokens + num_new_tokens
        if end < table.work_at:
            return ()   # the common decode step: the last block has room, none fills
        # Past the common case (in line: a block-filling step makes this call for every
        # running request): a window to move, blocks to take, a block that fills.
        if self.sliding_window is not None:
            self._free_outside_window(table, request.num_computed_tokens)
        size = self.block_size
        slots = table.num_slots
        if end <= slots:
            new_blocks: list[int] | tuple[()] = ()   # room left
        elif end <= slots + size:   # one block more: a decode step crossed into it
            block_id = self.pool.allocate_one()
            if block_id is None:
                return None
            table.block_ids.append(block_id)
            table.num_slots = slots + size
            new_blocks = [block_id]
        else:
            block_ids = table.block_ids
            missing = self.blocks_for(end) - len(block_ids)
            if missing > self.pool.num_free:
                return None
            new_blocks = self.pool.allocate(missing)
            block_ids.extend(new_blocks)
            table.num_slots = len(block_ids) * size
        if end >= table.register_at:
            table.num_registered = self.prefix.register(
                request, table.block_ids, table.num_registered, end, step)
            table.register_at = (table.num_registered + 1) * size
            if self.checkpoint_span:
                self._plan_checkpoints(request, end, step)
        self._set_work_at(table)
        return new_blocks

    def reserve_slots(self, request: Request, num_slots: int) -> list[int] | tuple[()] | None:
        """Slots for the request's first `num_slots` positions, for speculative drafts:
        blocks appended as needed (returned), none registered in the prefix cache (drafts
        are not verified tokens); None, changing nothing, when the pool is short. Slots
        past what the drafts' tokens turn out to need stay in the table: the next step
        asks for them again."""
        table = self._tables[request.handle]
        if num_slots <= table.num_slots:
            return ()
        missing = self.blocks_for(num_slots) - len(table.block_ids)
        if missing > self.pool.num_free:
            return None
        new_blocks = self.pool.allocate(missing)
        table.block_ids.extend(new_blocks)
        table.num_slots = len(table.block_ids) * self.block_size
        self._set_work_at(table)
        return new_blocks

    def free(self, request: Request) -> None:
        """Release every block the request holds, on the device and in the swap space
        (preempted to be recomputed: its prefix hashes stay for its next admission)."""
        table = self._tables.get(request.handle)
        if table is None:
            return
        self.pool.release(table.block_ids)   # the null entries are skipped
        table.block_ids = []
        table.num_registered = 0
        table.num_freed = 0
        if table.cpu_block_ids:
            self.swap.drop(table.cpu_block_ids)
            table.cpu_block_ids = []
        if table.state_slot is not None:
            self.states.give_back(table.state_slot)
            table.state_slot = None
        if table.cpu_state_slot is not None:
            self.swap.release_state(table.cpu_state_slot)
            table.cpu_state_slot = None
        self._retable(table)

    def forget(self, request: Request) -> None:
        """The request finished: free its blocks and drop its table and hashes."""
        self.free(request)
        self.states.forget(request.handle)
        self._tables.pop(request.handle, None)
        self.prefix.forget(request)

    # ---- admission ----------------------------------------------------------------------

    def find_cached_prefix(self, request: Request) -> CachedPrefix:
        """Blocks already holding the request's leading full blocks, and the tokens they
        count (pass it to can_admit and admit)."""
        hits = self.prefix.find(request)
        if self.states.enabled:
            return self._resume_point(request, hits)
        return CachedPrefix(hits, len(hits) * self.block_size)

    def can_admit(self, request: Request, cached: CachedPrefix) -> bool:
        """Whether the pool holds the blocks of the whole request after the cached prefix
        (with a window: at most its peak footprint), and a state slot for a hybrid."""
        if self.states.enabled and self.states.num_free < 1 + (checkpoint_slot(cached) >= 0):
            return False   # its own slot, the checkpoint it copies kept
        hits = cached.blocks
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

    def admit(self, request: Request, cached: CachedPrefix, num_new_tokens: int,
              step: int) -> list[int] | tuple[()]:
        """Start the request's table from the cached prefix (request.num_computed_tokens
        already counts it) with slots for `num_new_tokens` more, computed by step `step`;
        can_admit said they fit. Returns the blocks appended after the prefix."""
        table = self._tables.get(request.handle)
        if table is None:
            table = self._tables[request.handle] = BlockTable()
        for block_id in cached.blocks:
            self.pool.share(block_id)
        table.block_ids = list(cached.blocks)
        table.num_registered = len(cached.blocks)
        if self.states.enabled and table.state_slot is None:
            resume = checkpoint_slot(cached)
            table.state_slot = self.states.take(request.handle, keep=resume)
            if resume >= 0:   # it resumes from the checkpoint's state
                self._state_copies.append((resume, table.state_slot))
        self._retable(table)
        new_blocks = self.allocate_slots(request, num_new_tokens, step)
        assert new_blocks is not None, "admission checked the free blocks"
        return new_blocks

    # ---- n > 1 --------------------------------------------------------------------------

    def fork(self, parent: Request, child: Request) -> bool:
        """Give `child` the parent's prompt minus its last token: the full blocks shared by
        reference, the partial one copied (the copy goes into the next plan, take_copies).
        False, changing nothing, when no block is free or (sliding window) the parent
        already freed a block the child's last prompt token reads."""
        prompt_len = parent.prompt_len
        shared = (prompt_len - 1) // self.block_size   # full blocks before the last token
        dead = self.dead_blocks(prompt_len - 1)
        parent_table = self._tables[parent.handle]
        if self.states.enabled:
            return False   # no state one token before the parent's: the child recomputes
        if self.pool.num_free < 1 or parent_table.num_freed > dead:
            return False
        block_ids = parent_table.block_ids
        for block_id in block_ids[dead:shared]:
            self.pool.share(block_id)
        (copy,) = self.pool.allocate(1)
        self._copies.append((block_ids[shared], copy))
        table = self._tables[child.handle] = BlockTable()
        table.block_ids = [self.pool.null_block] * dead + block_ids[dead:shared] + [copy]
        table.num_freed = dead
        table.num_registered = shared
        self._retable(table)
        self.prefix.fork(parent, child, shared)
        return True

    def take_state_work(self) -> tuple[list[tuple[int, int]], list[tuple[int, int, int]]]:
        """A hybrid's state copies (checkpoint slot, request slot) and checkpoints to write
        (handle, tokens, slot) planned since the last call."""
        work = self._state_copies, self._checkpoints
        self._state_copies, self._checkpoints = [], []
        return work

    def _resume_point(self, request: Request, hits: list[int]) -> CachedPrefix:
        """A hybrid's hit: the blocks up to the deepest checkpoint among them, or none."""
        span_blocks = self.checkpoint_span // self.block_size if self.checkpoint_span else 0
        # Resuming needs a slot of its own besides the checkpoint: with one slot to spare,
        # it computes from the start rather than wait.
        if span_blocks and self.states.num_free >= 2:
            for count in range(len(hits) // span_blocks * span_blocks, 0, -span_blocks):
                block_hash = self.prefix.block_hash(request, count - 1)
                slot = None if block_hash is None else self.states.find_checkpoint(block_hash)
                if slot is not None:
                    return ResumedPrefix(hits[:count], count * self.block_size, slot)
        return CachedPrefix([], 0)

    def _plan_checkpoints(self, request: Request, end: int, step: int) -> None:
        """Checkpoints at the span multiples this step computes whose block is hashed,
        deepest first: the deepest may evict an older checkpoint, the others only take
        free slots."""
        span = self.checkpoint_span
        tokens = end // span * span
        evict = True
        while tokens > request.num_computed_tokens:
            block_hash = self.prefix.block_hash(request, tokens // self.block_size - 1)
            slot = None if block_hash is None else self.states.add_checkpoint(
                block_hash, request.handle, evict)
            if slot is not None:
                self._checkpoints.append((request.handle, tokens, slot))
                evict = False
            tokens -= span

    def take_state_swaps(self) -> tuple[list[tuple[int, int]], list[tuple[int, int]]]:
        """A hybrid's state slots swapped out (device, host) and in (host, device) since
        the last call."""
        swaps, self._state_swaps = self._state_swaps, ([], [])
        return swaps

    def take_copies(self) -> list[tuple[int, int]]:
        """The (source, destination) block copies forks made since the last call."""
        copies, self._copies = self._copies, []
        return copies

    # ---- swap ---------------------------------------------------------------------------

    def swap_out(self, request: Request) -> list[tuple[int, int]]:
        """Move the request's live blocks to the swap space (the caller checked
        num_free_swap_blocks against num_live_blocks) and release them; returns the
        (device, CPU) pairs to copy. The count of freed entries stays, so swap_in restores
        them as null entries. A hybrid's state goes to a host slot (the caller checked
        num_free_swap_state_slots), its device slot freed."""
        table = self._tables[request.handle]
        if table.state_slot is not None:
            table.cpu_state_slot = self.swap.store_state()
            self._state_swaps[0].append((table.state_slot, table.cpu_state_slot))
            self.states.give_back(table.state_slot)
            table.state_slot = None
        live = table.block_ids[table.num_freed:]
        table.cpu_block_ids = self.swap.store(live)
        self.pool.release(table.block_ids)
        table.block_ids = []
        table.num_registered = 0
        self._retable(table)
        return list(zip(live, table.cpu_block_ids))

    def swap_in(self, request: Request, num_new_tokens: int, step: int
                ) -> list[tuple[int, int]] | None:
        """Device blocks for a swapped-out request's computed tokens and `num_new_tokens`
        more, computed by step `step`; returns the (CPU, device) pairs to copy, or None,
        changing nothing, when the pool (or a hybrid's state slots) is short."""
        table = self._tables[request.handle]
        freed = table.num_freed   # entries that left the window stay null
        end = request.num_computed_tokens + num_new_tokens
        needed = self.blocks_for(end) - freed
        if needed > self.pool.num_free:
            return None
        if table.cpu_state_slot is not None:
            if self.states.num_free < 1:
                return None
            table.state_slot = self.states.take(request.handle)
            self._state_swaps[1].append((table.cpu_state_slot, table.state_slot))
            self.swap.release_state(table.cpu_state_slot)
            table.cpu_state_slot = None
        device_blocks = self.pool.allocate(needed)
        pairs = self.swap.load(table.cpu_block_ids, device_blocks)
        table.cpu_block_ids = []
        table.block_ids = ([self.pool.null_block] * freed + device_blocks if freed
                           else device_blocks)
        self._retable(table)
        self.register_full_blocks(request, end, step)
        return pairs

    def _retable(self, table: BlockTable) -> None:
        """Cache what the per-step calls test, after block_ids or num_registered changed:
        the slots the table holds, and the token count at which a block fills that the
        prefix cache has not registered (NEVER with it off)."""
        size = self.block_size
        table.num_slots = len(table.block_ids) * size
        table.register_at = (table.num_registered + 1) * size if self.prefix.enabled else NEVER
        self._set_work_at(table)

    def _set_work_at(self, table: BlockTable) -> None:
        """After num_slots or register_at changed: the first token count allocate_slots
        has work at (0 with a sliding window: any call may free blocks). Registering a
        block in allocate_slots and register_full_blocks keeps register_at there, as
        _retable does here."""
        if self.sliding_window is not None:
            table.work_at = 0
        else:
            slots_end = table.num_slots + 1
            register_at = table.register_at
            table.work_at = slots_end if slots_end < register_at else register_at

    # ---- prefix cache -------------------------------------------------------------------

    def register_full_blocks(self, request: Request, num_tokens: int, step: int) -> None:
        """Make the full blocks among the request's first `num_tokens` tokens findable,
        unconfirmed until step `step`'s result arrives (confirm_through): for a token just
        learned that a step already planned computes (its block may be full now), and after
        a swap-in. One step ahead, update calls it for every token a step returns: the
        common case costs one lookup and a compare."""
        table = self._tables[request.handle]
        if num_tokens >= table.register_at:   # the prefix cache registers what it can
            table.num_registered = self.prefix.register(
                request, table.block_ids, table.num_registered, num_tokens, step)
            table.register_at = (table.num_registered + 1) * self.block_size
            self._set_work_at(table)

    def confirm_through(self, step: int) -> None:
        """Steps up to `step` ran: their blocks hold what their hashes say."""
        self.prefix.confirm_through(step)
        self.states.confirm_through(step)

    def discard_unconfirmed(self) -> None:
        """A step failed: no later request may find the blocks registered for steps that
        never returned (they may hold garbage); the tables that registered them rewind."""
        self.states.discard_unconfirmed()
        lost = self.prefix.discard_unconfirmed()
        if not lost:
            return
        size = self.block_size
        for table in self._tables.values():
            for index, block_id in enumerate(table.block_ids[:table.num_registered]):
                if block_id in lost:
                    table.num_registered = index
                    table.register_at = (index + 1) * size
                    self._set_work_at(table)
                    break

    def unconfirmed_blocks(self) -> set[int]:
        return self.prefix.unconfirmed_blocks()

    # ---- sliding window -----------------------------------------------------------------

    def dead_blocks(self, first_position: int) -> int:
        """Leading blocks no layer reads once the next token computed is at first_position."""
        if self.sliding_window is None:
            return 0
        return max(0, first_position - self.sliding_window + 1) // self.block_size

    def _free_outside_window(self, table: BlockTable, first_position: int) -> None:
        block_ids = table.block_ids
        dead = min(self.dead_blocks(first_position), len(block_ids))
        start = table.num_freed
        if dead <= start:
            return
        self.pool.release(block_ids[start:dead])
        null = self.pool.null_block
        for index in range(start, dead):
            block_ids[index] = null
        table.num_freed = dead
