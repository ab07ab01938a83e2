"""Device slots for the adapters a GPU step may use, laid out for the segmented kernel
(kernels/triton_lora.py): per LoRA-able module, A [slots, R, in] and B [slots, out, R],
zero past each adapter's own rank (and for the modules it leaves alone), so one launch pair
serves every adapter of the step whatever their ranks.

R is the module's largest fused rank: --max-lora-rank times the slices fused into it (q, k
and v in qkv_proj; gate and up in gate_up_proj), since an adapter's q, k and v pairs stack
their ranks (executor/lora/adapter.py)."""

from __future__ import annotations

import torch

from folio.executor.lora.adapter import LoraWeights
from folio.executor.models.weight_names import FUSED_SLICES


class LoraSlotPools:
    def __init__(self, shapes: dict[str, tuple[int, int]], slots: int, max_rank: int,
                 device: torch.device, dtype: torch.dtype) -> None:
        self.a: dict[str, torch.Tensor] = {}
        self.b: dict[str, torch.Tensor] = {}
        for path, (size_in, size_out) in shapes.items():
            module = path.split(".", 2)[2]   # "layers.3.self_attn.qkv_proj" -> its module
            rank = max_rank * FUSED_SLICES.get(module, 1)
            self.a[path] = torch.zeros(slots, rank, size_in, device=device, dtype=dtype)
            self.b[path] = torch.zeros(slots, size_out, rank, device=device, dtype=dtype)

    def put(self, slot: int, weights: LoraWeights) -> None:
        """Write `weights` into `slot` (whatever sat there is overwritten)."""
        for path, a_pool in self.a.items():
            b_pool = self.b[path]
            a_pool[slot].zero_()
            b_pool[slot].zero_()
            pair = weights.pairs.get(path)
            if pair is not None:
                a, b = pair
                a_pool[slot, :a.shape[0]].copy_(a)
                b_pool[slot, :, :b.shape[1]].copy_(b)
