"""A fixed pool of KV blocks: a free list and a reference count per block."""

from __future__ import annotations

from collections import deque


class OutOfBlocks(RuntimeError):
    pass


class BlockPool:
    def __init__(self, num_blocks: int) -> None:
        self.num_blocks = num_blocks
        self._free: deque[int] = deque(range(num_blocks))
        self._ref_counts = [0] * num_blocks

    @property
    def num_free(self) -> int:
        return len(self._free)

    @property
    def num_used(self) -> int:
        return self.num_blocks - len(self._free)

    def ref_count(self, block_id: int) -> int:
        return self._ref_counts[block_id]

    def allocate(self, count: int) -> list[int]:
        if count > len(self._free):
            raise OutOfBlocks(f"asked for {count} blocks, {len(self._free)} free")
        blocks = [self._free.popleft() for _ in range(count)]
        for block_id in blocks:
            self._ref_counts[block_id] = 1
        return blocks

    def share(self, block_id: int) -> None:
        if self._ref_counts[block_id] < 1:
            raise ValueError(f"block {block_id} is free and cannot be shared")
        self._ref_counts[block_id] += 1

    def release(self, blocks: list[int]) -> None:
        # Release in reverse so a request's tail blocks are reused last (LIFO keeps
        # recently touched memory warm and makes the free list order deterministic).
        for block_id in reversed(blocks):
            count = self._ref_counts[block_id]
            if count < 1:
                raise ValueError(f"block {block_id} released while free")
            self._ref_counts[block_id] = count - 1
            if count == 1:
                self._free.append(block_id)
