"""LoRA applied per row of a mixed batch: y = base(x) + B_a (A_a x) for each token whose
request names adapter a, nothing for the base model's tokens (docs/lora.md).

A step's tokens are grouped by adapter (`LoraStep.groups`); each LoRA-able projection runs one
pair of small matmuls per adapter present in the step, on that adapter's rows only (slices
when each adapter's rows are contiguous; else the adapters' rows are gathered once, grouped,
and scattered back once). Measured on CPU against the
gathered batched form (every token's A and B gathered, then torch.bmm), the grouped one is
faster at every mix tried (bench/lora.py, docs/benchmarks.md). A step with no adapter row
leaves `groups` empty and each layer runs its base linear alone. On CUDA the adapters sit in
device slot pools (executor/lora/slot_pools.py) and each projection runs the segmented
kernel (kernels/triton_lora.py): two launches whatever the number of adapters. On CPU with
the C++ operators built, they sit in host slots (executor/lora/cpu_pools.py) and each
projection makes one call of the C++ segmented operator (kernels/cpu/lora_segments.cpp).
"""

from __future__ import annotations

import torch
from torch import nn

from folio.executor.lora.adapter import LoraWeights
from folio.executor.lora.files import target_shapes


class LoraStep:
    """The adapter groups of the step being run, shared by every LoRA-able layer, written
    by the executor before each forward: (adapter, slice of rows) pairs. `rows` None: the
    slices are of the batch itself (each adapter's rows contiguous); else the slices are of
    the batch's rows gathered in this order (each adapter's rows together), so each layer
    gathers once and scatters once whatever the number of adapters. `segments`: on the
    segmented kernel's path, (rows, blocks, pools) for kernels/triton_lora.py, else None.
    `cpu_segments`: on the C++ operator's path, (rows, groups, pools) for
    kernels/cpu_lora.py, else None."""

    __slots__ = ("groups", "rows", "segments", "cpu_segments")

    def __init__(self) -> None:
        self.groups: list[tuple[LoraWeights | None, slice]] = []
        self.rows: torch.Tensor | None = None
        self.segments: tuple | None = None
        self.cpu_segments: tuple | None = None


def add_lora(x: torch.Tensor, out: torch.Tensor, path: str, step: LoraStep) -> torch.Tensor:
    """out += B (A x) on each adapter's rows, for the module at `path` (in place)."""
    if step.cpu_segments is not None:
        from folio.kernels.cpu_lora import lora_segments_cpu

        rows, groups, pools = step.cpu_segments
        pool = pools.modules.get(path)
        if pool is None:   # no adapter loaded so far changes this module
            return out
        return lora_segments_cpu(x, out, pool.a, pool.bt, pool.spans, rows, groups)
    if step.segments is not None:
        from folio.kernels.triton_lora import lora_segments

        rows, blocks, pools = step.segments
        return lora_segments(x, out, pools.a[path], pools.b[path], rows, blocks)
    if step.rows is None:
        for adapter, rows in step.groups:
            pair = adapter.pairs.get(path)
            if pair is not None:
                out[rows] += (x[rows] @ pair[0].t()) @ pair[1].t()
        return out
    gathered = x.index_select(0, step.rows)
    delta = out.new_zeros(len(step.rows), out.shape[1])
    for adapter, rows in step.groups:
        pair = adapter.pairs.get(path)
        if pair is not None:
            torch.mm(gathered[rows] @ pair[0].t(), pair[1].t(), out=delta[rows])
    return out.index_add_(0, step.rows, delta)


def _lora_forward(base_forward, path: str, step: LoraStep):
    """The module's own forward, then its adapters' terms when the step has any. Set as the
    module's forward, not wrapped in another module: a step without adapter rows pays one
    Python check per projection, not a module call (3 us each, measured)."""
    def forward(x: torch.Tensor) -> torch.Tensor:
        out = base_forward(x)
        return add_lora(x, out, path, step) if step.groups else out
    # The base linear's output on a step without adapter rows: executor/native_step runs the
    # base weights itself on those steps (CausalLM.forward checks the step's groups).
    forward.lora_step = step
    return forward


def wrap_lora_targets(model: nn.Module, step: LoraStep) -> None:
    """Give every module an adapter may change (executor/lora/files.py's target_shapes)
    the LoRA forward."""
    for path in target_shapes(model.config):
        _, index, owner_name, leaf = path.split(".")
        module = getattr(getattr(model.layers[int(index)], owner_name), leaf)
        module.forward = _lora_forward(module.forward, path, step)
