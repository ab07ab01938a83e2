"""A fixed pool of KV blocks with reference counts and a prefix cache.

Every block is in exactly one state: free (no references, no cached contents), cached-free
(no references, contents registered under a prefix hash, reusable until evicted) or used
(one or more references). Unreferenced blocks wait in one queue in eviction order: the
least recently released block is taken first, and taking a cached-free block evicts it.

With `reserve_null` (sliding-window models) block 0 is the null block, in none of those
states: a block table entry whose block left every layer's window points at it, no query
reads it, and it is never allocated, shared, released or registered (calls skip it).
"""

from __future__ import annotations

from collections import OrderedDict

from folio.scheduler.kv_events import KVEventLog
from folio.shared.prefix_hash import chain_hash

__all__ = ["BlockPool", "OutOfBlocks", "chain_hash"]   # chain_hash: shared with the router


class OutOfBlocks(RuntimeError):
    """A bug, never a load condition: every caller (KVCacheManager, SwapSpace) checks
    num_free before it allocates, so nothing catches this."""


class BlockPool:
    def __init__(self, num_blocks: int, reserve_null: bool = False,
                 events: KVEventLog | None = None) -> None:
        self.num_blocks = num_blocks
        self.events = events   # records what becomes findable and what stops being so
        self.null_block: int | None = 0 if reserve_null else None
        self._ref_counts = [0] * num_blocks
        self._hash_of: list[bytes | None] = [None] * num_blocks
        self._cached: dict[bytes, int] = {}
        self._num_cached_free = 0
        # Unreferenced blocks, oldest first; values unused.
        self._unreferenced: OrderedDict[int, None] = OrderedDict.fromkeys(
            range(1 if reserve_null else 0, num_blocks))

    # ---- counts -------------------------------------------------------------------------

    @property
    def num_free(self) -> int:
        """Blocks that can be allocated now: plain free plus cached-free."""
        return len(self._unreferenced)

    @property
    def num_usable(self) -> int:
        """Blocks requests can hold: all but the null block."""
        return self.num_blocks - (self.null_block is not None)

    @property
    def num_used(self) -> int:
        return self.num_usable - len(self._unreferenced)

    @property
    def num_cached_free(self) -> int:
        return self._num_cached_free

    def ref_count(self, block_id: int) -> int:
        return self._ref_counts[block_id]

    def block_hash(self, block_id: int) -> bytes | None:
        return self._hash_of[block_id]

    def ref_counts(self) -> list[int]:
        return list(self._ref_counts)

    def cached_free_ids(self) -> list[int]:
        """Unreferenced blocks whose contents the prefix cache can still find."""
        refs = self._ref_counts
        return [block_id for block_id in self._cached.values() if refs[block_id] == 0]

    # ---- allocation ---------------------------------------------------------------------

    def allocate(self, count: int) -> list[int]:
        """Take `count` blocks, evicting cached-free ones oldest first. Asking for more than
        num_free is a caller's bug (OutOfBlocks), and takes nothing."""
        if count > len(self._unreferenced):
            raise OutOfBlocks(f"asked for {count} blocks, {len(self._unreferenced)} free")
        unreferenced, hash_of, refs = self._unreferenced, self._hash_of, self._ref_counts
        blocks = []
        for _ in range(count):
            block_id = unreferenced.popitem(last=False)[0]
            if hash_of[block_id] is not None:
                self._evict(block_id)
            refs[block_id] = 1
            blocks.append(block_id)
        return blocks

    def allocate_one(self) -> int | None:
        """allocate(1)'s block, or None, taking nothing, when none is free: a decode step
        crossing into a new block, once per request every block_size steps."""
        unreferenced = self._unreferenced
        if not unreferenced:
            return None
        block_id = unreferenced.popitem(last=False)[0]
        if self._hash_of[block_id] is not None:
            self._evict(block_id)
        self._ref_counts[block_id] = 1
        return block_id

    def share(self, block_id: int) -> None:
        """One more reference to a block that is used or cached-free."""
        if block_id == self.null_block:
            return
        if self._ref_counts[block_id] == 0:
            if self._hash_of[block_id] is None:
                raise ValueError(f"block {block_id} is free and holds nothing to share")
            del self._unreferenced[block_id]
            self._num_cached_free -= 1
        self._ref_counts[block_id] += 1

    def release(self, blocks: list[int]) -> None:
        # Reverse order: a request's tail blocks are the least likely to be shared again,
        # so they are queued to be evicted first.
        null = self.null_block
        for block_id in reversed(blocks):
            if block_id == null:
                continue   # a table entry freed once it left the window
            count = self._ref_counts[block_id]
            if count < 1:
                raise ValueError(f"block {block_id} released while free")
            self._ref_counts[block_id] = count - 1
            if count == 1:
                self._unreferenced[block_id] = None
                if self._hash_of[block_id] is not None:
                    self._num_cached_free += 1

    # ---- prefix cache -------------------------------------------------------------------

    def lookup(self, block_hash: bytes) -> int | None:
        return self._cached.get(block_hash)

    def register(self, block_id: int, block_hash: bytes) -> bool:
        """Record that a used, full block holds (or, once its step runs, will hold) the
        tokens `block_hash` names. False if nothing changed."""
        if (self._hash_of[block_id] is not None or block_hash in self._cached
                or block_id == self.null_block):
            return False   # already registered, the same contents live in another block, or
            # the entry was freed (it left the window) before its tokens were known
        self._hash_of[block_id] = block_hash
        self._cached[block_hash] = block_id
        return True

    def unregister(self, block_id: int) -> None:
        """Forget what a block holds (the step that was to write it failed)."""
        if self._hash_of[block_id] is None:
            return
        if self._ref_counts[block_id] == 0:
            self._num_cached_free -= 1
        del self._cached[self._hash_of[block_id]]
        if self.events is not None:
            self.events.removed(self._hash_of[block_id])
        self._hash_of[block_id] = None

    def _evict(self, block_id: int) -> None:
        block_hash = self._hash_of[block_id]
        if block_hash is not None:
            del self._cached[block_hash]
            self._hash_of[block_id] = None
            self._num_cached_free -= 1
            if self.events is not None:
                self.events.removed(block_hash)
