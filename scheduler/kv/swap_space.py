"""The CPU swap pool: where a swapped-out request's live blocks wait, one CPU block per
device block, until it comes back. Only KVCacheManager calls it (and keeps which CPU blocks
are whose); the pairs it builds are the executor's copy orders (device -> CPU on the way
out, CPU -> device on the way in)."""

from __future__ import annotations

from folio.scheduler.kv.block_pool import BlockPool


class SwapSpace:
    def __init__(self, num_blocks: int) -> None:
        self.pool = BlockPool(num_blocks)

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

    def drop(self, cpu_blocks: list[int]) -> None:
        """Release CPU blocks without copying them back."""
        self.pool.release(cpu_blocks)
