"""W8A8 int8 linear layers (int8 weights and per-token int8 activations): `--quantization
int8` served these until issue 27 measured that quantizing the activations cost SmolLM2-135M
5% perplexity (weight-only int8: 0.25%); it now serves executor/weight_only_linear.py. Kept
for the kernel benches (bench/int8_kernels.py, bench/quant_kernels.py) and as the record of
that measurement.

A decode step reads every weight once, so on a CPU its speed is the bytes of the weights:
int8 weights are a quarter of float32's. Weights are quantized at load, per output channel
and symmetrically (scale = max|row| / 127), and stay int8 in memory.

The matmul is W8A8 with activations quantized on each call (dynamic): int8 x int8 ->
int32, rescaled by the activation and channel scales. Measured on this project's CPUs
(docs/benchmarks.md, "Quantized weights"), FBGEMM's prepacked dynamic linear (inside torch)
was as fast as `torch._int_mm` on the decoder's layers and 4x faster on lm_head at one
token (_int_mm reorders the weight on every call); torch's weight-only
`_weight_int8pack_mm` was slower than float32 oneDNN at every size. So one path, at every
batch size; _int_mm stays as the fallback for torch builds without FBGEMM.
"""

from __future__ import annotations

import warnings

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
    """y = x @ W.T + b with W held as int8 rows and one float32 scale per row.

    Activations are quantized per token on both kernels. `kernel`: "prepacked" (FBGEMM's
    dynamic quantized linear, the int8 weight reordered once into its blocked layout),
    "int_mm" (torch._int_mm on the plain [N, K] int8 weight) or "auto" (prepacked where
    this torch has it). _int_mm reorders the weight on every call, which costs more than
    the multiply on a large matrix.
    """

    def __init__(self, linear: nn.Linear, kernel: str = "auto") -> None:
        super().__init__()
        self.in_features = linear.in_features
        self.out_features = linear.out_features
        q, scale = quantize_rows(linear.weight)
        bias = None if linear.bias is None else linear.bias.detach().float().clone()
        if kernel == "auto":
            kernel = "prepacked" if prepacked_available() else "int_mm"
        self.kernel = kernel
        self.register_buffer("scale", scale, persistent=False)
        self.register_buffer("bias", bias, persistent=False)
        if kernel == "prepacked":
            self.packed = torch.ops.quantized.linear_prepack(_per_channel(q, scale), None)
            self.weight = None
        else:
            # Kept [N, K] (the checkpoint's layout); its transpose is _int_mm's [K, N].
            self.register_buffer("weight", q, persistent=False)

    def int8_weight(self) -> torch.Tensor:
        """The int8 [N, K] weight as held (unpacked from the prepacked layout)."""
        if self.weight is not None:
            return self.weight
        return torch.ops.quantized.linear_unpack(self.packed)[0].int_repr()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        shape = x.shape
        flat = x.reshape(-1, self.in_features).float()
        peak = flat.abs().amax(dim=1, keepdim=True).clamp(min=1e-12)
        if self.weight is None:
            # FBGEMM quantizes the whole batch with one scale: one token's outliers (a
            # sequence's first token has huge activations) would flatten every other row.
            # Each row divided by its peak first, then multiplied back, is per-token.
            out = torch.ops.quantized.linear_dynamic(flat / peak, self.packed, False)
            out.mul_(peak)
        else:
            token_scale = peak / INT8_MAX
            xq = torch.round(flat / token_scale).to(torch.int8)
            # int32 x float32 promotes to float32: the rescale is one pass over the output.
            out = torch._int_mm(xq, self.weight.t()) * (token_scale * self.scale)
        if self.bias is not None:
            out.add_(self.bias)
        return out.to(x.dtype).reshape(*shape[:-1], self.out_features)


def prepacked_available() -> bool:
    return (hasattr(torch.ops.quantized, "linear_dynamic")
            and "fbgemm" in torch.backends.quantized.supported_engines)


def _per_channel(q: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    """`q` as the per-channel qint8 tensor linear_prepack takes (torch marks building
    quantized tensors deprecated; the prepacked kernel has no other entry yet)."""
    zeros = torch.zeros(q.shape[0], dtype=torch.long)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)
        return torch._make_per_channel_quantized_tensor(q, scale.double(), zeros, 0)


def int8_unavailable_reason(device: torch.device) -> str | None:
    """Why int8 linears cannot run here, or None when they can."""
    if device.type != "cpu":
        return f"int8 weights run on the CPU executor only (the device is {device.type})"
    if not prepacked_available() and not hasattr(torch, "_int_mm"):
        return "this torch build has neither FBGEMM's quantized linear nor torch._int_mm"
    return None
