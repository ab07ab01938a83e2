"""Per-request block tables over a BlockPool: a block is taken only when a token needs a slot."""

from __future__ import annotations

from scheduler.block_pool import BlockPool
from scheduler.request import Request


class KVCacheManager:
    def __init__(self, pool: BlockPool, block_size: int) -> None:
        self.pool = pool
        self.block_size = block_size

    def blocks_for(self, num_tokens: int) -> int:
        return -(-num_tokens // self.block_size)

    def num_missing_blocks(self, request: Request, num_tokens: int) -> int:
        return max(0, self.blocks_for(num_tokens) - len(request.block_ids))

    def grow(self, request: Request, num_tokens: int) -> list[int] | None:
        """Give `request` slots for its first `num_tokens` tokens; None if the pool is short."""
        missing = self.num_missing_blocks(request, num_tokens)
        if missing > self.pool.num_free:
            return None
        new_blocks = self.pool.allocate(missing)
        request.block_ids.extend(new_blocks)
        return new_blocks

    def free(self, request: Request) -> None:
        self.pool.release(request.block_ids)
        request.block_ids = []
