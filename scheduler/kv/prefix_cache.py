"""Prefix-cache lookups and registrations for KVCacheManager (its only caller): a full
block is named by the chained SHA-256 of its parent's hash and its token ids, and enters
the cache when the step computing its last token is planned, unconfirmed until that step's
result arrives; a failed step takes its registrations back.

It keeps each request's hash chain (token-derived: kept across preemptions, until forget),
never a block table: the manager hands it the block ids to register and writes back what
it answers."""

from __future__ import annotations

from collections import deque
from typing import Callable, NamedTuple

from folio.scheduler.kv.block_pool import BlockPool, chain_hash
from folio.scheduler.request import Request


class CachedPrefix(NamedTuple):
    """What find_cached_prefix found: the blocks holding a request's leading full blocks
    (leading null entries for those behind a sliding window) and the tokens they count."""
    blocks: list[int]
    num_tokens: int


class ResumedPrefix(CachedPrefix):
    """A hybrid model's hit: also the checkpoint slot holding the state after its tokens
    (scheduler/kv/state_slots.py). Compares as the plain (blocks, num_tokens) pair."""

    def __new__(cls, blocks: list[int], num_tokens: int, state_slot: int):
        prefix = super().__new__(cls, blocks, num_tokens)
        prefix.state_slot = state_slot
        return prefix


def checkpoint_slot(cached: CachedPrefix) -> int:
    """The checkpoint a hit resumes its recurrent state from; -1 for none."""
    return getattr(cached, "state_slot", -1)


class PrefixCache:
    def __init__(self, pool: BlockPool, block_size: int, enabled: bool,
                 dead_blocks: Callable[[int], int] | None) -> None:
        self.pool = pool
        self.block_size = block_size
        self.enabled = enabled
        self._dead_blocks = dead_blocks   # a sliding window's, else None
        # Prefix hashes of each request's full blocks, in order, by request handle.
        self._hashes: dict[int, list[bytes]] = {}
        # Registrations whose step has not returned yet: (step id, block ids).
        self._unconfirmed: deque[tuple[int, list[int]]] = deque()

    def find(self, request: Request) -> list[int]:
        """Blocks already holding this request's leading full blocks. At least one token is
        always left to compute, so the request still gets logits to sample from."""
        if not self.enabled or request.sampling.prompt_logprobs is not None:
            return []   # prompt logprobs need every prompt position computed
        usable = (request.num_tokens - 1) // self.block_size
        hashes = self._hashes_of(request)
        _extend_hashes(request, hashes, usable, self.block_size)
        if self._dead_blocks is not None:
            return self._windowed_prefix(hashes[:usable])
        hits = []
        for block_hash in hashes[:usable]:
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
        dead_blocks = self._dead_blocks
        found: list[int | None] = []
        best = run_start = 0
        for index, block_hash in enumerate(hashes):
            block_id = self.pool.lookup(block_hash)
            found.append(block_id)
            if block_id is None:
                run_start = index + 1
            elif run_start <= dead_blocks((index + 1) * self.block_size):
                best = index + 1
        dead = dead_blocks(best * self.block_size)
        return [self.pool.null_block] * dead + found[dead:best]

    def register(self, request: Request, block_ids: list[int], start: int, num_tokens: int,
                 step: int) -> int:
        """Make the full blocks among the request's first `num_tokens` tokens findable by
        later requests, as soon as those tokens are scheduled: a request admitted later in
        the same step reads them after the step's forward pass wrote them (each layer writes
        the cache for every token before attending). Only tokens whose ids are known count.
        `block_ids` is its table (read here, never kept or changed), of which the first
        `start` blocks are registered; returns how many are now."""
        size = self.block_size
        known = request.num_tokens
        full = (num_tokens if num_tokens < known else known) // size
        if full > len(block_ids):
            full = len(block_ids)
        if full <= start:
            return start
        hashes = self._hashes.get(request.handle)
        if hashes is None:
            hashes = self._hashes[request.handle] = []
        first = start * size - request.prompt_len
        if full == start + 1 == len(hashes) + 1 and first >= 0:
            # A decode step filled one block of output: hash it and register it here.
            block_hash = chain_hash(hashes[-1] if start else request.prefix_seed,
                                    request.output_token_ids[first:first + size])
            hashes.append(block_hash)
            block_id = block_ids[start]
            if self.pool.register(block_id, block_hash):
                self._unconfirmed_in(step, [block_id])
                if self.pool.events is not None:
                    self.pool.events.stored([block_hash], hashes[-2] if start else None,
                                            request.output_token_ids[first:first + size])
            return full
        if len(hashes) < full:
            _extend_hashes(request, hashes, full, size)
        register = self.pool.register
        registered = [block_id for block_id, block_hash in zip(
            block_ids[start:full], hashes[start:full]) if register(block_id, block_hash)]
        if registered:
            self._unconfirmed_in(step, registered)
            if self.pool.events is not None:
                self._record_stored(request, set(registered), block_ids, hashes, start, full)
        return full

    def _record_stored(self, request: Request, registered: set[int], block_ids: list[int],
                       hashes: list[bytes], start: int, full: int) -> None:
        """The blocks just registered, one event per run of neighbours (a block whose
        contents another block already held was not registered)."""
        size, events = self.block_size, self.pool.events
        run: list[int] = []
        for index in range(start, full + 1):
            if index < full and block_ids[index] in registered:
                run.append(index)
                continue
            if run:
                first, last = run[0], run[-1] + 1
                events.stored(hashes[first:last], hashes[first - 1] if first else None,
                              _tokens(request, first * size, last * size))
                run = []

    def fork(self, parent: Request, child: Request, num_blocks: int) -> None:
        """The child shares the parent's first `num_blocks` full blocks: their hashes too."""
        hashes = self._hashes.get(parent.handle)
        if hashes is not None:
            self._hashes[child.handle] = hashes[:num_blocks]

    def block_hashes(self, request: Request) -> list[bytes]:
        """The request's hash chain so far (a copy)."""
        return list(self._hashes.get(request.handle, ()))

    def block_hash(self, request: Request, index: int) -> bytes | None:
        """The hash of the request's block `index`, if its chain reaches it yet."""
        hashes = self._hashes.get(request.handle)
        return hashes[index] if hashes is not None and index < len(hashes) else None

    def handles(self) -> set[int]:
        """The handles of the requests it holds a hash chain for."""
        return set(self._hashes)

    def forget(self, request: Request) -> None:
        """The request finished: drop its hash chain."""
        self._hashes.pop(request.handle, None)

    def _hashes_of(self, request: Request) -> list[bytes]:
        hashes = self._hashes.get(request.handle)
        if hashes is None:
            hashes = self._hashes[request.handle] = []
        return hashes

    def _unconfirmed_in(self, step: int, blocks: list[int]) -> None:
        """Blocks registered for `step`, unconfirmed until its result: one entry per step."""
        unconfirmed = self._unconfirmed
        if unconfirmed and unconfirmed[-1][0] == step:
            unconfirmed[-1][1].extend(blocks)
        else:
            unconfirmed.append((step, blocks))

    def confirm_through(self, step: int) -> None:
        unconfirmed = self._unconfirmed
        while unconfirmed and unconfirmed[0][0] <= step:
            unconfirmed.popleft()

    def discard_unconfirmed(self) -> set[int]:
        """Forget every unconfirmed registration; returns the blocks it named (the manager
        rewinds the tables that registered them)."""
        lost = self.unconfirmed_blocks()
        self._unconfirmed.clear()
        for block_id in lost:
            self.pool.unregister(block_id)
        return lost

    def unconfirmed_blocks(self) -> set[int]:
        return {block_id for _, blocks in self._unconfirmed for block_id in blocks}


def _extend_hashes(request: Request, hashes: list[bytes], count: int, size: int) -> None:
    index = len(hashes)
    parent = hashes[-1] if hashes else request.prefix_seed
    while index < count:
        parent = chain_hash(parent, _tokens(request, index * size, (index + 1) * size))
        hashes.append(parent)
        index += 1


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
