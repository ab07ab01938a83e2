"""Host slots for the adapters a CPU step may use, laid out for the C++ segmented operator
(kernels/cpu/lora_segments.cpp): per LoRA-able module, A [slots, R, in], B transposed
[slots, R, out] (a rank's output columns contiguous) and spans [slots, P, 4], each slot's
(o0, o1, k0, k1) blocks of B that are not zero. A fused module's B is block-diagonal (q, k
and v each read their own ranks: executor/lora/adapter.py), and the slots are zero past each
adapter's rank, so the operator reads only the spans: no more weight bytes per step than the
adapters' own.

A module's pool is made when the first adapter that changes it is put (its shapes taken
from that adapter's pair, so a tensor-parallel rank's shares fit as they are); R is
--max-lora-rank times the slices fused into the module, as on CUDA (slot_pools.py)."""

from __future__ import annotations

import torch

from folio.executor.lora.adapter import LoraWeights
from folio.executor.models.weight_names import FUSED_SLICES

# More blocks than this (a B with scattered zero rows) are read as one block over them all.
MAX_SPANS = 4


def native_lora_unavailable(device: torch.device, dtype: torch.dtype) -> str | None:
    """Why a CPU step's adapters run as torch matmuls per adapter, or None: the C++ operator."""
    from folio.kernels import cpu_attention

    if device.type != "cpu":
        return f"the device is {device.type}"
    if dtype not in (torch.float32, torch.bfloat16):
        return f"{str(dtype).removeprefix('torch.')} weights"
    status = cpu_attention.load()
    return None if status.ok else f"the C++ CPU operators are not built: {status.detail}"


def nonzero_spans(b: torch.Tensor) -> list[tuple[int, int, int, int]]:
    """(o0, o1, k0, k1) blocks covering every non-zero of b [out, rank]: runs of rows whose
    non-zero columns span the same range; rows of zeros are left out."""
    nonzero = b != 0
    rank = b.shape[1]
    used = nonzero.any(1)
    first = nonzero.int().argmax(1)
    last = rank - nonzero.flip(1).int().argmax(1)
    spans: list[tuple[int, int, int, int]] = []
    for row, (is_used, k0, k1) in enumerate(zip(used.tolist(), first.tolist(), last.tolist())):
        if not is_used:
            continue
        if spans and spans[-1][1] == row and spans[-1][2:] == (k0, k1):
            spans[-1] = (spans[-1][0], row + 1, k0, k1)
        else:
            spans.append((row, row + 1, k0, k1))
    if len(spans) > MAX_SPANS:
        spans = [(spans[0][0], spans[-1][1], min(s[2] for s in spans), max(s[3] for s in spans))]
    return spans


class ModulePool:
    __slots__ = ("a", "bt", "spans")

    def __init__(self, slots: int, rank: int, size_in: int, size_out: int,
                 dtype: torch.dtype) -> None:
        self.a = torch.zeros(slots, rank, size_in, dtype=dtype)
        self.bt = torch.zeros(slots, rank, size_out, dtype=dtype)
        self.spans = torch.zeros(slots, MAX_SPANS, 4, dtype=torch.int64)


class LoraCpuPools:
    def __init__(self, slots: int, max_rank: int, dtype: torch.dtype) -> None:
        self.slots, self.max_rank, self.dtype = slots, max_rank, dtype
        self.modules: dict[str, ModulePool] = {}

    def put(self, slot: int, weights: LoraWeights) -> None:
        """Write `weights` into `slot` (whatever sat there is dropped: its spans cleared)."""
        for path, (a, b) in weights.pairs.items():
            if path not in self.modules:
                module = path.split(".", 2)[2]   # "layers.3.self_attn.qkv_proj" -> its module
                rank = self.max_rank * FUSED_SLICES.get(module, 1)
                self.modules[path] = ModulePool(self.slots, rank, a.shape[1], b.shape[0],
                                                self.dtype)
        for path, pool in self.modules.items():
            pool.spans[slot].zero_()
            pair = weights.pairs.get(path)
            if pair is None:
                continue
            a, b = pair
            pool.a[slot, :a.shape[0]].copy_(a)
            pool.bt[slot, :b.shape[1]].copy_(b.t())
            spans = nonzero_spans(b)
            if spans:
                pool.spans[slot, :len(spans)] = torch.tensor(spans, dtype=torch.int64)
