"""An adapter's share on one tensor-parallel rank (docs/lora.md): each pair split the way
its module's weight is (executor/parallel/sharding.py).

- Column-parallel modules (qkv, gate/up: split by output rows): A whole, B's rows this
  rank's, by the same q/k/v or gate/up slicing as the weight's.
- Row-parallel modules (o, down: split by input columns): A's columns this rank's, B whole.
  Each rank adds B (A_r x_r) to its partial output, and the all-reduce that sums the base's
  partials sums these to B (A x)."""

from __future__ import annotations

from folio.executor.lora.adapter import LoraWeights
from folio.executor.parallel.sharding import row_parallel


def shard_adapter(weights: LoraWeights, tp) -> LoraWeights:
    pairs = {}
    for path, (a, b) in weights.pairs.items():
        name = f"{path}.weight"
        if row_parallel(name):
            pairs[path] = (tp.shard(name, None, a).contiguous(), b)
        else:
            pairs[path] = (a, tp.shard(name, None, b).contiguous())
    return LoraWeights(weights.name, weights.path, weights.rank, pairs)
