"""Linear layers on the fastest matmul the device has.

On CPU, torch's default `F.linear` calls MKL's sgemm, which on AMD processors runs a generic
kernel; oneDNN (already inside torch) runs about twice as fast at a model's shapes once its
weights are reordered ("prepacked") into its blocked layout. The reorder happens once, after
the checkpoint is loaded; the forward then needs no per-call weight transform.

bfloat16 weights on a CPU with AVX-512 BF16 go to Folio's own kernel instead
(kernels/cpu/bf16_gemm.cpp, TiledBf16Linear): oneDNN's one-row bfloat16 kernel reads the
weights at about half the memory's speed there, and Folio's matches oneDNN for batches.
"""

from __future__ import annotations

import logging

import torch
from torch import nn

from folio.executor.models.moe import SparseMoe
from folio.executor.quantization.weight_only_linear import WeightOnlyLinear
from folio.kernels.bf16_layout import bf16_gemm_available, pack_bf16
from folio.kernels.onednn_packing import onednn_packs

log = logging.getLogger("folio.executor")

_PACKABLE = (torch.float32, torch.bfloat16)


class PackedLinear(nn.Module):
    """y = x @ W.T + b with W held in oneDNN's prepacked layout (CPU only)."""

    def __init__(self, linear: nn.Linear) -> None:
        super().__init__()
        self.in_features = linear.in_features
        self.out_features = linear.out_features
        weight = linear.weight.detach()
        self.register_buffer("packed_weight",
                             torch.ops.mkldnn._reorder_linear_weight(weight, None),
                             persistent=False)
        bias = None if linear.bias is None else linear.bias.detach().clone()
        self.register_buffer("bias", bias, persistent=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.dim() == 2 and x.shape[0] == 1 and x.dtype == torch.float32:
            # The row twice: oneDNN's one-row float32 kernel sums in another order than its
            # batch kernel, so one user's tokens would differ from the same request's in a
            # batch (tests/executor/test_batch_invariance.py). The weights are read once
            # either way.
            return self._linear(x.expand(2, -1))[:1]
        return self._linear(x)

    def _linear(self, x: torch.Tensor) -> torch.Tensor:
        return torch.ops.mkldnn._linear_pointwise(x, self.packed_weight, self.bias, "none",
                                                  [], "")


class TiledBf16Linear(nn.Module):
    """y = x @ W.T + b, bfloat16, on kernels/cpu/bf16_gemm.cpp with W in its tiles
    (kernels/bf16_layout.py). One kernel for every batch size: a row's sums run in the same
    order alone or in a batch."""

    def __init__(self, linear: nn.Linear) -> None:
        super().__init__()
        self.in_features = linear.in_features
        self.out_features = linear.out_features
        self.register_buffer("packed_weight", pack_bf16(linear.weight.detach()),
                             persistent=False)
        bias = None if linear.bias is None else linear.bias.detach().float().contiguous()
        self.register_buffer("bias", bias, persistent=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        flat = x.reshape(-1, self.in_features).contiguous()
        y = torch.ops.folio.bf16_linear(flat, self.packed_weight, self.bias, self.out_features)
        return y.view(*x.shape[:-1], self.out_features)


def tiled_bf16_unavailable_reason(device: torch.device, dtype: torch.dtype) -> str | None:
    """Why Folio's BF16 kernel cannot serve the linear layers here, or None when it can."""
    from folio.kernels import cpu_attention

    if device.type != "cpu" or dtype != torch.bfloat16:
        return "not bfloat16 on the CPU"
    if not cpu_attention.load().ok:
        return f"the CPU operators are not built ({cpu_attention.load().detail})"
    if not bf16_gemm_available():
        return "the CPU operators were built without AVX-512 BF16"
    return None


def float_linear(linear: nn.Linear, path: str) -> nn.Module:
    """`linear` on the float path pack_linears chose ("bf16-tiles", "onednn", "torch")."""
    if path == "bf16-tiles" and linear.in_features % 2 == 0:
        return TiledBf16Linear(linear)
    if path in ("bf16-tiles", "onednn"):
        return PackedLinear(linear)
    return linear


def onednn_unavailable_reason(device: torch.device, dtype: torch.dtype) -> str | None:
    """Why oneDNN cannot serve the linear layers here, or None when it can."""
    if device.type != "cpu":
        return f"the device is {device.type}"
    if dtype not in _PACKABLE:
        return f"{dtype} weights are not prepacked"
    if not onednn_packs(dtype):
        return f"oneDNN cannot prepack {dtype} weights on this CPU (it needs AVX-512 or AVX-NE-CONVERT)"
    if not torch.backends.mkldnn.is_available():
        return "this torch build has no oneDNN"
    if not hasattr(torch.ops.mkldnn, "_linear_pointwise"):
        return "this torch build lacks mkldnn._linear_pointwise"
    return None


def pack_linears(model: nn.Module, device: torch.device, dtype: torch.dtype,
                 backend: str = "auto", quantization: str = "none",
                 int8_activations: bool = False) -> str:
    """Swap every nn.Linear of `model` for a PackedLinear where oneDNN can run it, or for
    a WeightOnlyLinear with quantization="int8" or "int4".

    `backend` is "auto" (Folio's BF16 kernel for bfloat16 where it is built, else oneDNN
    where it can run), "onednn" (or an error) or "torch". Returns the name of the matmul
    path used: "bf16-tiles", "onednn", "torch" (plain F.linear), "int8" or "int4".
    """
    if quantization in QUANTIZED_BITS:
        return _quantize_linears(model, device, dtype, backend, QUANTIZED_BITS[quantization],
                                 int8_activations)
    if quantization != "none":
        raise ValueError(f"quantization={quantization!r} is not supported (none, int8, int4)")
    if backend == "torch":
        log.info("linear layers: torch F.linear (asked for)")
        return "torch"
    reason = onednn_unavailable_reason(device, dtype)
    if reason is not None and backend == "onednn":
        raise ValueError(f"linear_backend='onednn' cannot run here: {reason}")
    if reason is not None:
        log.info("linear layers: torch F.linear (%s)", reason)
        return "torch"
    path = "onednn"
    if backend == "auto" and tiled_bf16_unavailable_reason(device, dtype) is None:
        path = "bf16-tiles"
    for parent in list(model.modules()):
        for name, child in list(parent.named_children()):
            if isinstance(child, nn.Linear):
                setattr(parent, name, float_linear(child, path))
    log.info("linear layers: %s", "Folio's AVX-512 BF16 kernel (kernels/cpu/bf16_gemm.cpp)"
             if path == "bf16-tiles" else "oneDNN with prepacked weights")
    return path


def _quantize_linears(model: nn.Module, device: torch.device, dtype: torch.dtype,
                      backend: str, bits: int, int8_activations: bool) -> str:
    """Every nn.Linear to int8/int4 weights, but a mixture-of-experts router: its few outputs
    decide which experts run, and it is too small for its bytes to matter. The router and any
    other linear left float go through the float path `backend` names. lm_head is quantized
    too, to int8 (a tied embedding keeps its float weight for the lookup)."""
    from folio.kernels import cpu_attention

    if device.type != "cpu":
        raise ValueError(f"quantization='int{bits}' runs on the CPU executor only (the "
                         f"device is {device.type})")
    native = cpu_attention.load().ok
    if not native:
        log.warning("linear layers: the CPU operators are not built (%s); int%d weights are "
                    "dequantized at every call, which is slow", cpu_attention.load().detail,
                    bits)
    routers = []
    for parent in list(model.modules()):
        for name, child in list(parent.named_children()):
            if isinstance(parent, SparseMoe) and name == "gate":
                routers.append(parent)
            elif isinstance(child, nn.Linear):
                # lm_head stays int8 under int4 (llama.cpp's Q4 files keep it at Q6_K/Q8_0
                # too): int4 there cost SmolLM2-135M 4.7% perplexity, int8 0.1%.
                layer_bits = 8 if parent is model and name == "lm_head" else bits
                setattr(parent, name, WeightOnlyLinear.from_linear(child, layer_bits, native,
                                                                     int8_activations))
    float_linears_to(routers, device, dtype, backend)
    log.info("linear layers: int%d weights (lm_head int8), %s activations", bits,
             "int8" if int8_activations else "float")
    return f"int{bits}"


def float_linears_to(routers: list[nn.Module], device: torch.device, dtype: torch.dtype,
                     backend: str) -> None:
    if routers:
        held = nn.ModuleList(parent.gate for parent in routers)
        pack_linears(held, device, dtype, backend)
        for parent, packed in zip(routers, held):
            parent.gate = packed


QUANTIZED_BITS = {"int8": 8, "int4": 4}
