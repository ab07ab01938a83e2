"""Per-request block tables over a BlockPool: a block is taken only when a token needs a
slot; full blocks are registered in the prefix cache and found again by later requests.

Sliding window (every layer windowed, the largest window W): a token at position p reads
keys p - W < j <= p, so once a request's next token is at p, its blocks wholly before
p - W + 1 are read by no layer again. They are released (a registered one stays findable
as cached-free) and their table entries name the pool's null block: the table keeps its
length, so positions still map to entries, and the freed entries are always the leading
ones (request.num_freed_blocks)."""

from __future__ import annotations

from scheduler.block_pool import BlockPool, chain_hash
from scheduler.request import Request


class KVCacheManager:
    def __init__(self, pool: BlockPool, block_size: int, enable_prefix_caching: bool,
                 sliding_window: int | None = None) -> None:
        if sliding_window is not None and pool.null_block is None:
            raise ValueError("a sliding window needs a pool with a null block")
        self.pool = pool
        self.block_size = block_size
        self.enable_prefix_caching = enable_prefix_caching
        self.sliding_window = sliding_window

    # ---- sliding window -----------------------------------------------------------------

    def dead_blocks(self, first_position: int) -> int:
        """Leading blocks no layer reads once the next token computed is at first_position."""
        if self.sliding_window is None:
            return 0
        return max(0, first_position - self.sliding_window + 1) // self.block_size

    def free_outside_window(self, request: Request, first_position: int) -> int:
        """Release the request's blocks wholly before the window of first_position (the
        position of the next token it computes); returns how many were released."""
        dead = min(self.dead_blocks(first_position), len(request.block_ids))
        start = request.num_freed_blocks
        if dead <= start:
            return 0
        table = request.block_ids
        self.pool.release(table[start:dead])
        null = self.pool.null_block
        for index in range(start, dead):
            table[index] = null
        request.num_freed_blocks = dead
        return dead - start

    def live_blocks(self, request: Request) -> list[int]:
        """The request's table without its freed entries."""
        return request.block_ids[request.num_freed_blocks:]

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
        self.pool.release(request.block_ids)   # the null entries are skipped
        request.block_ids = []
        request.num_registered = 0
        request.num_freed_blocks = 0

    # ---- prefix cache -------------------------------------------------------------------

    def cached_prefix(self, request: Request) -> list[int]:
        """Blocks already holding this request's leading full blocks. At least one token is
        always left to compute, so the request still gets logits to sample from."""
        if not self.enable_prefix_caching or request.sampling.prompt_logprobs is not None:
            return []   # prompt logprobs need every prompt position computed
        usable = (request.num_tokens - 1) // self.block_size
        self._extend_hashes(request, usable)
        if self.sliding_window is not None:
            return self._windowed_prefix(request.block_hashes[:usable])
        hits = []
        for block_hash in request.block_hashes[:usable]:
            block_id = self.pool.lookup(block_hash)
            if block_id is None:
                break
            hits.append(block_id)
        return hits

    def _windowed_prefix(self, hashes: list[bytes]) -> list[int]:
        """The longest hit whose first new token's window is cached: k leading blocks count
        as computed when blocks dead_blocks(k * size) .. k - 1 are found, whatever became of
        the earlier ones (evicted after they left the window). Those come back as null
        entries. (A chained hash found means its whole prefix matches.)"""
        found: list[int | None] = []
        best = run_start = 0
        for index, block_hash in enumerate(hashes):
            block_id = self.pool.lookup(block_hash)
            found.append(block_id)
            if block_id is None:
                run_start = index + 1
            elif run_start <= self.dead_blocks((index + 1) * self.block_size):
                best = index + 1
        dead = self.dead_blocks(best * self.block_size)
        return [self.pool.null_block] * dead + found[dead:best]

    def num_reclaimable(self, blocks: list[int]) -> int:
        """How many of `blocks` are cached-free, i.e. counted in the free pool today."""
        return sum(1 for b in blocks if self.pool.ref_count(b) == 0)

    def register_full_blocks(self, request: Request, num_tokens: int) -> list[int]:
        """Make the full blocks among the request's first `num_tokens` tokens findable by
        later requests, as soon as those tokens are scheduled: a request admitted later in
        the same step reads them after the step's forward pass wrote them (each layer writes
        the cache for every token before attending). Only tokens whose ids are known count.
        Returns the blocks newly registered."""
        if not self.enable_prefix_caching:
            return []
        full = min(num_tokens, request.num_tokens) // self.block_size
        full = min(full, len(request.block_ids))
        if full <= request.num_registered:
            return []
        self._extend_hashes(request, full)
        registered = [block_id for block_id, block_hash in zip(
            request.block_ids[request.num_registered:full],
            request.block_hashes[request.num_registered:full])
            if self.pool.register(block_id, block_hash)]
        request.num_registered = full
        return registered

    def _extend_hashes(self, request: Request, count: int) -> None:
        size = self.block_size
        hashes = request.block_hashes
        while len(hashes) < count:
            index = len(hashes)
            parent = hashes[-1] if hashes else None
            hashes.append(chain_hash(parent, _tokens(request, index * size, (index + 1) * size)))


def _tokens(request: Request, start: int, end: int) -> list[int]:
    """request.all_token_ids[start:end] without copying the whole list (decode steps hash
    one block of a long output)."""
    prompt = request.prompt_token_ids
    split = len(prompt)
    if end <= split:
        return prompt[start:end]
    output = request.output_token_ids
    if start >= split:
        return output[start - split:end - split]
    return prompt[start:] + output[:end - split]
