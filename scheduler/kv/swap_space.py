"""The CPU swap pool: where a swapped-out request's live blocks wait, one CPU block per
device block, until it comes back, and a hybrid model's request its recurrent state, in a
host state slot. Only KVCacheManager calls it (and keeps which CPU blocks and slots are
whose); the pairs it builds are the executor's copy orders (device -> CPU on the way out,
CPU -> device on the way in)."""

from __future__ import annotations

from folio.scheduler.kv.block_pool import BlockPool


class SwapSpace:
    def __init__(self, num_blocks: int, num_state_slots: int = 0) -> None:
        self.pool = BlockPool(num_blocks)
        self.num_state_slots = num_state_slots
        self._free_states = list(range(num_state_slots - 1, -1, -1))   # pop(): the lowest

    @property
    def num_free(self) -> int:
        return self.pool.num_free

    def store(self, device_blocks: list[int]) -> list[int]:
        """A CPU block for each of `device_blocks`, in order (the caller checked num_free):
        the pairs to copy out are zip(device_blocks, result)."""
        return self.pool.allocate(len(device_blocks))

    def load(self, cpu_blocks: list[int], device_blocks: list[int]) -> list[tuple[int, int]]:
        """Release `cpu_blocks`; returns the (CPU, device) pairs to copy in.
        `device_blocks` may be longer (room for the tokens after the swapped ones)."""
        pairs = list(zip(cpu_blocks, device_blocks))
        self.pool.release(cpu_blocks)
        return pairs

    @property
    def num_free_state_slots(self) -> int:
        return len(self._free_states)

    def store_state(self) -> int:
        """A host state slot (the caller checked num_free_state_slots)."""
        return self._free_states.pop()

    def release_state(self, cpu_slot: int) -> None:
        """The state came back (or its request ended): the host slot is free again."""
        self._free_states.append(cpu_slot)

    def drop(self, cpu_blocks: list[int]) -> None:
        """Release CPU blocks without copying them back."""
        self.pool.release(cpu_blocks)
