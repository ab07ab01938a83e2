"""Linear layers on the fastest matmul the device has.

On CPU, torch's default `F.linear` calls MKL's sgemm, which on AMD processors runs a generic
kernel; oneDNN (already inside torch) runs about twice as fast at a model's shapes once its
weights are reordered ("prepacked") into its blocked layout. The reorder happens once, after
the checkpoint is loaded; the forward then needs no per-call weight transform.
"""

from __future__ import annotations

import logging

import torch
from torch import nn

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
        return torch.ops.mkldnn._linear_pointwise(x, self.packed_weight, self.bias, "none",
                                                  [], "")


def onednn_unavailable_reason(device: torch.device, dtype: torch.dtype) -> str | None:
    """Why oneDNN cannot serve the linear layers here, or None when it can."""
    if device.type != "cpu":
        return f"the device is {device.type}"
    if dtype not in _PACKABLE:
        return f"{dtype} weights are not prepacked"
    if not torch.backends.mkldnn.is_available():
        return "this torch build has no oneDNN"
    if not hasattr(torch.ops.mkldnn, "_linear_pointwise"):
        return "this torch build lacks mkldnn._linear_pointwise"
    return None


def pack_linears(model: nn.Module, device: torch.device, dtype: torch.dtype,
                 backend: str = "auto") -> str:
    """Swap every nn.Linear of `model` for a PackedLinear where oneDNN can run it.

    `backend` is "auto" (oneDNN where it can run), "onednn" (or an error) or "torch".
    Returns the name of the matmul path used: "onednn" or "torch" (plain F.linear).
    """
    if backend == "torch":
        log.info("linear layers: torch F.linear (asked for)")
        return "torch"
    reason = onednn_unavailable_reason(device, dtype)
    if reason is not None and backend == "onednn":
        raise ValueError(f"linear_backend='onednn' cannot run here: {reason}")
    if reason is not None:
        log.info("linear layers: torch F.linear (%s)", reason)
        return "torch"
    for parent in list(model.modules()):
        for name, child in list(parent.named_children()):
            if isinstance(child, nn.Linear):
                setattr(parent, name, PackedLinear(child))
    log.info("linear layers: oneDNN with prepacked weights")
    return "onednn"
