"""Which data-parallel replica takes a request: the one holding its prompt's prefix, unless
that replica is much busier than the least loaded one (then the least loaded), as SGLang's
cache-aware router decides.

The router cannot see the replicas' prefix caches; it remembers, in a bounded LRU, which
replica it last sent each full prompt block to (named by the scheduler's own chained block
hash, shared/prefix_hash.py), which is where that block's KV is cached if anywhere.
"""

from __future__ import annotations

import itertools
from collections import OrderedDict
from dataclasses import dataclass

from folio.shared.prefix_hash import adapter_seed, full_block_hashes


@dataclass(frozen=True)
class RoutingConfig:
    max_remembered_blocks: int = 65_536   # LRU entries (~100 bytes each)
    max_hashed_blocks: int = 512          # blocks hashed per prompt (8k tokens at 16)
    cache_threshold: float = 0.5          # matched share of the prompt's full blocks to follow
    balance_abs: int = 8                  # follow the prefix unless its replica has this many
    balance_rel: float = 1.5              # ... more requests than the least loaded, and this
                                          # many times as many


@dataclass(frozen=True)
class ReplicaLoad:
    index: int
    requests: int      # running + waiting (what this frontend knows, or the replica's stats)
    free_blocks: int


class PrefixRouter:
    def __init__(self, config: RoutingConfig = RoutingConfig()) -> None:
        self.config = config
        self.owner: OrderedDict[bytes, int] = OrderedDict()   # block hash -> replica
        self.turn = itertools.count()   # rotates ties, so equal replicas share a light load

    def choose(self, prompt_ids: list[int], block_size: int, loads: list[ReplicaLoad],
               lora: str | None = None) -> tuple[int, int]:
        """(replica index, prompt blocks matched there) among `loads` (replicas serving
        now, at least one); remembers the choice for the prompt's blocks. `lora`: the
        request's adapter, whose blocks are hashed apart (as the scheduler does)."""
        hashes = full_block_hashes(prompt_ids, block_size, self.config.max_hashed_blocks,
                                   adapter_seed(lora))
        matched, holder = self._match(hashes)
        by_index = {load.index: load for load in loads}
        least = self._least_loaded(loads)
        chosen = least.index
        if holder in by_index and matched >= self.config.cache_threshold * len(hashes) \
                and not self._imbalanced(by_index[holder], least):
            chosen = holder
        self._remember(hashes, chosen)
        return chosen, matched if chosen == holder else 0

    def forget_replica(self, index: int) -> None:
        """A restarted replica lost its cache: its entries point nowhere useful."""
        for block_hash in [h for h, r in self.owner.items() if r == index]:
            del self.owner[block_hash]

    def _match(self, hashes: list[bytes]) -> tuple[int, int | None]:
        matched, holder = 0, None
        for block_hash in hashes:   # chained: the first miss ends the shared prefix
            replica = self.owner.get(block_hash)
            if replica is None or (holder is not None and replica != holder):
                break
            matched, holder = matched + 1, replica
        return matched, holder

    def _least_loaded(self, loads: list[ReplicaLoad]) -> ReplicaLoad:
        best = min((load.requests, -load.free_blocks) for load in loads)
        tied = [load for load in loads if (load.requests, -load.free_blocks) == best]
        return tied[next(self.turn) % len(tied)]

    def _imbalanced(self, holder: ReplicaLoad, least: ReplicaLoad) -> bool:
        return (holder.requests - least.requests > self.config.balance_abs
                and holder.requests > self.config.balance_rel * least.requests)

    def _remember(self, hashes: list[bytes], replica: int) -> None:
        owner = self.owner
        for block_hash in hashes:
            owner[block_hash] = replica
            owner.move_to_end(block_hash)
        while len(owner) > self.config.max_remembered_blocks:
            owner.popitem(last=False)
