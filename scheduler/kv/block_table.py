"""One request's row in KVCacheManager: its device block table, its swap blocks, and the
counts cached from them for the scheduler's per-step calls. Only KVCacheManager creates,
reads and writes these; everyone else asks the manager."""

from __future__ import annotations

# A register_at no token count reaches (the prefix cache is off).
NEVER = 1 << 62


class BlockTable:
    __slots__ = ("block_ids", "num_freed", "cpu_block_ids", "num_registered", "num_slots",
                 "register_at", "work_at", "state_slot", "cpu_state_slot")

    def __init__(self) -> None:
        # Device blocks in reading order. Leading entries freed once they left every
        # layer's window (sliding-window models) name the null block: num_freed of them,
        # a count kept while swapped out so swap-in restores them.
        self.block_ids: list[int] = []
        self.num_freed = 0
        self.cpu_block_ids: list[int] = []   # the live blocks' copies while swapped out
        self.num_registered = 0              # leading blocks already in the prefix cache
        # Cached for the per-step calls (allocate_slots, register_full_blocks), kept equal
        # to what they cache by KVCacheManager (_retable, _set_work_at, and where it
        # registers blocks):
        # len(block_ids) * block_size; the token count at which a block fills that the
        # prefix cache has not registered, (num_registered + 1) * block_size (NEVER with it
        # off); and the first token count allocate_slots has work at,
        # min(num_slots + 1, register_at) (0 with a sliding window: any call may free
        # blocks). Until the manager first sets them: a table that holds nothing.
        self.num_slots = 0
        self.register_at = NEVER
        self.work_at = 0
        # A hybrid model's recurrent state slot while it holds one (scheduler/kv/state_slots.py).
        self.state_slot: int | None = None
        self.cpu_state_slot: int | None = None   # where that state waits while swapped out
