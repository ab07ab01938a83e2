"""The CPU swap pool: where a swapped-out request's live blocks wait, one CPU block per
device block, until it comes back. Only KVCacheManager calls it; the pairs it returns are
the executor's copy orders (device -> CPU on the way out, CPU -> device on the way in)."""

from __future__ import annotations

from folio.scheduler.block_pool import BlockPool
from folio.scheduler.request import Request


class SwapSpace:
    def __init__(self, num_blocks: int) -> None:
        self.pool = BlockPool(num_blocks)

    @property
    def num_free(self) -> int:
        return self.pool.num_free

    def store(self, request: Request, device_blocks: list[int]) -> list[tuple[int, int]]:
        """Give the request a CPU block for each of `device_blocks`; returns the
        (device, CPU) pairs to copy out. The caller checked num_free."""
        cpu_blocks = self.pool.allocate(len(device_blocks))
        request.cpu_block_ids = cpu_blocks
        return list(zip(device_blocks, cpu_blocks))

    def load(self, request: Request, device_blocks: list[int]) -> list[tuple[int, int]]:
        """Release the request's CPU blocks; returns the (CPU, device) pairs to copy in.
        `device_blocks` may be longer (room for the tokens after the swapped ones)."""
        pairs = list(zip(request.cpu_block_ids, device_blocks))
        self.drop(request)
        return pairs

    def drop(self, request: Request) -> None:
        """Release the request's CPU blocks without copying them back."""
        self.pool.release(request.cpu_block_ids)
        request.cpu_block_ids = []
