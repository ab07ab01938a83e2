"""LoRA applied per row of a mixed batch: y = base(x) + B_a (A_a x) for each token whose
request names adapter a, nothing for the base model's tokens (docs/lora.md).

A step's tokens are grouped by adapter (`LoraStep.groups`); each LoRA-wrapped linear runs one
pair of small matmuls per adapter present in the step, on that adapter's rows only (a slice
when they are contiguous, a gather and an index_add otherwise). Measured on CPU against the
gathered batched form (every token's A and B gathered, then torch.bmm), the grouped one is
faster at every mix tried (bench/lora.py, docs/benchmarks.md). A step with no adapter row
leaves `groups` empty and each layer runs its base linear alone. CUDA runs the same torch
code (no dedicated kernel yet).
"""

from __future__ import annotations

import torch
from torch import nn

from folio.executor.lora_adapter import LoraWeights
from folio.executor.lora_files import target_shapes


class LoraStep:
    """The adapter groups of the step being run, shared by every wrapped layer: a list of
    (adapter, row slice or row index tensor). Written by the executor before each forward."""

    __slots__ = ("groups",)

    def __init__(self) -> None:
        self.groups: list[tuple[LoraWeights, slice | torch.Tensor]] = []


class LoraLinear(nn.Module):
    def __init__(self, base: nn.Module, path: str, step: LoraStep) -> None:
        super().__init__()
        self.base = base
        self.path = path   # the key of this module's pair in LoraWeights.pairs
        self.step = step

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = self.base(x)
        for adapter, rows in self.step.groups:
            pair = adapter.pairs.get(self.path)
            if pair is None:
                continue
            a, b = pair
            if isinstance(rows, slice):
                out[rows] += (x[rows] @ a.t()) @ b.t()
            else:
                out.index_add_(0, rows, (x.index_select(0, rows) @ a.t()) @ b.t())
        return out


def wrap_lora_targets(model: nn.Module, step: LoraStep) -> None:
    """Wrap every module an adapter may change (executor/lora_files.py's target_shapes)."""
    for path in target_shapes(model.config):
        _, index, owner_name, leaf = path.split(".")
        owner = getattr(model.layers[int(index)], owner_name)
        setattr(owner, leaf, LoraLinear(getattr(owner, leaf), path, step))
