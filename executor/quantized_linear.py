"""int8 linear layers for the CPU executor (`--quantization int8`).

A decode step reads every weight once, so on a CPU its speed is the bytes of the weights:
int8 weights are a quarter of float32's. Weights are quantized at load, per output channel
and symmetrically (scale = max|row| / 127), and stay int8 in memory.

The matmul is W8A8: each call quantizes its activations per token (dynamic, symmetric),
multiplies int8 x int8 -> int32 with `torch._int_mm` (oneDNN, VNNI where the CPU has it)
and rescales by (token scale x channel scale). Measured against torch's weight-only
`_weight_int8pack_mm` on this project's CPUs it was faster at every batch size, 1 token
included (docs/benchmarks.md, "Quantized weights"), so it is the one path.
"""

from __future__ import annotations

import torch
from torch import nn

INT8_MAX = 127


def quantize_rows(weight: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(int8 [N, K], float32 scales [N]) with weight ~= q * scale[:, None], per row."""
    weight = weight.detach().float()
    scale = weight.abs().amax(dim=1).clamp(min=1e-12) / INT8_MAX
    q = torch.round(weight / scale[:, None]).clamp(-INT8_MAX, INT8_MAX).to(torch.int8)
    return q, scale


class Int8Linear(nn.Module):
    """y = x @ W.T + b with W held as int8 rows and one float32 scale per row."""

    def __init__(self, linear: nn.Linear) -> None:
        super().__init__()
        self.in_features = linear.in_features
        self.out_features = linear.out_features
        q, scale = quantize_rows(linear.weight)
        # Kept [N, K] (the checkpoint's layout); its transpose is the [K, N] operand
        # _int_mm reads without a copy.
        self.register_buffer("weight", q, persistent=False)
        self.register_buffer("scale", scale, persistent=False)
        bias = None if linear.bias is None else linear.bias.detach().float().clone()
        self.register_buffer("bias", bias, persistent=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        shape = x.shape
        flat = x.reshape(-1, self.in_features).float()
        token_scale = flat.abs().amax(dim=1, keepdim=True).clamp(min=1e-12) / INT8_MAX
        xq = torch.round(flat / token_scale).to(torch.int8)
        out = torch._int_mm(xq, self.weight.t()).float()
        out.mul_(token_scale).mul_(self.scale)
        if self.bias is not None:
            out.add_(self.bias)
        return out.to(x.dtype).reshape(*shape[:-1], self.out_features)


def int8_unavailable_reason(device: torch.device) -> str | None:
    """Why int8 linears cannot run here, or None when they can."""
    if device.type != "cpu":
        return f"int8 weights run on the CPU executor only (the device is {device.type})"
    if not hasattr(torch, "_int_mm"):
        return "this torch build lacks torch._int_mm"
    return None
