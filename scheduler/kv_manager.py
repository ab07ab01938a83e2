"""Per-request block tables over a BlockPool: a block is taken only when a token needs a
slot; full blocks are registered in the prefix cache and found again by later requests."""

from __future__ import annotations

from scheduler.block_pool import BlockPool, chain_hash
from scheduler.request import Request


class KVCacheManager:
    def __init__(self, pool: BlockPool, block_size: int, enable_prefix_caching: bool) -> None:
        self.pool = pool
        self.block_size = block_size
        self.enable_prefix_caching = enable_prefix_caching

    def blocks_for(self, num_tokens: int) -> int:
        return -(-num_tokens // self.block_size)

    def num_missing_blocks(self, request: Request, num_tokens: int) -> int:
        return max(0, self.blocks_for(num_tokens) - len(request.block_ids))

    def grow(self, request: Request, num_tokens: int) -> list[int] | None:
        """Give `request` slots for its first `num_tokens` tokens; None if the pool is short."""
        missing = self.num_missing_blocks(request, num_tokens)
        if missing == 0:
            return []   # the common decode case: the last block still has room
        if missing > self.pool.num_free:
            return None
        new_blocks = self.pool.allocate(missing)
        request.block_ids.extend(new_blocks)
        return new_blocks

    def free(self, request: Request) -> None:
        self.pool.release(request.block_ids)
        request.block_ids = []
        request.num_registered = 0

    # ---- prefix cache -------------------------------------------------------------------

    def cached_prefix(self, request: Request) -> list[int]:
        """Blocks already holding this request's leading full blocks. At least one token is
        always left to compute, so the request still gets logits to sample from."""
        if not self.enable_prefix_caching or request.sampling.prompt_logprobs is not None:
            return []   # prompt logprobs need every prompt position computed
        tokens = request.all_token_ids
        usable = (len(tokens) - 1) // self.block_size
        self._extend_hashes(request, tokens, usable)
        hits = []
        for block_hash in request.block_hashes[:usable]:
            block_id = self.pool.lookup(block_hash)
            if block_id is None:
                break
            hits.append(block_id)
        return hits

    def num_reclaimable(self, blocks: list[int]) -> int:
        """How many of `blocks` are cached-free, i.e. counted in the free pool today."""
        return sum(1 for b in blocks if self.pool.ref_count(b) == 0)

    def register_full_blocks(self, request: Request) -> None:
        """Make the request's computed full blocks findable by later requests."""
        if not self.enable_prefix_caching:
            return
        full = min(request.num_computed_tokens // self.block_size, len(request.block_ids))
        tokens = request.all_token_ids
        self._extend_hashes(request, tokens, full)
        for index in range(request.num_registered, full):
            self.pool.register(request.block_ids[index], request.block_hashes[index])
        request.num_registered = max(request.num_registered, full)

    def _extend_hashes(self, request: Request, tokens: list[int], count: int) -> None:
        size = self.block_size
        hashes = request.block_hashes
        while len(hashes) < count:
            index = len(hashes)
            parent = hashes[-1] if hashes else None
            hashes.append(chain_hash(parent, tokens[index * size:(index + 1) * size]))
