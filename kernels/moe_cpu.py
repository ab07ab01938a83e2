"""fused_moe for the cpu kernel set: the grouped path on oneDNN with prepacked expert weights.

Same meaning and grouping as `moe_reference.fused_moe_ref` (pairs sorted by expert, one
matmul pair per expert with tokens, a float32 weighted sum back). What differs is the matmul:
each expert's w13[e] and w2[e] are reordered once into oneDNN's blocked layout (as
executor/linear.py does for the dense layers), which made the whole call 1.3-2x faster than
with F.linear (MKL) from 64 tokens up at Mixtral- and Qwen3-MoE-like expert shapes on this
project's AMD CPU (docs/benchmarks.md, "MoE experts on CPU"). Small experts (under `min_pack_elements` weights in w13[e]) and single tokens keep
F.linear (the reference path): there oneDNN's fixed cost per call outweighs its gain.

The packed copies are made on the first call with a given (w13, w2) pair and kept by this
object, keyed by the tensors' identity, storage and version counter, so weights loaded or
changed in place afterwards are packed again. They double the experts' memory: the model
still holds its own w13 and w2 (the torch and Triton paths read those).
"""

from __future__ import annotations

import weakref
from collections.abc import Callable
from dataclasses import dataclass

import torch

from folio.kernels.onednn_packing import onednn_packs
from folio.kernels.moe_reference import (check_activation, check_moe_args, gated_activation,
                                         grouped_moe, sort_by_expert)

_PACKABLE = (torch.float32, torch.bfloat16)
DEFAULT_MIN_PACK_ELEMENTS = 1 << 17     # w13[e] of 128K weights, e.g. H 256 x 2I 512


def onednn_available() -> bool:
    return (torch.backends.mkldnn.is_available()
            and hasattr(torch.ops.mkldnn, "_linear_pointwise")
            and hasattr(torch.ops.mkldnn, "_reorder_linear_weight"))


def _stamp(tensor: torch.Tensor) -> tuple:
    """What must not change for a packed copy of `tensor` to stay valid. (Inference tensors
    keep no version counter: for them an in-place change is not seen.)"""
    version = None if tensor.is_inference() else tensor._version
    return (tensor.data_ptr(), version, tuple(tensor.shape), tensor.stride(), tensor.dtype)


@dataclass(frozen=True)
class _Packed:
    w13_ref: weakref.ref
    w2_ref: weakref.ref
    stamps: tuple
    experts: tuple[tuple[torch.Tensor, torch.Tensor], ...]   # (w13[e], w2[e]) packed

    def valid_for(self, w13: torch.Tensor, w2: torch.Tensor) -> bool:
        return (self.w13_ref() is w13 and self.w2_ref() is w2
                and self.stamps == (_stamp(w13), _stamp(w2)))


class CpuFusedMoe:
    """A fused_moe callable; one per kernel set (it owns the packed copies it made)."""

    def __init__(self, min_pack_elements: int = DEFAULT_MIN_PACK_ELEMENTS) -> None:
        self._min_pack_elements = min_pack_elements
        self._onednn = onednn_available()
        self._packable = tuple(dtype for dtype in _PACKABLE if onednn_packs(dtype))
        self._packed: dict[int, _Packed] = {}

    @property
    def num_packed(self) -> int:
        """How many (w13, w2) pairs this object holds packed copies of."""
        return len(self._packed)

    def uses_onednn(self, w13: torch.Tensor, tokens: int) -> bool:
        """oneDNN for experts big enough, and more than one token (one row per expert: the
        product is bound by reading the weights, where both matmuls are alike, and F.linear
        has the smaller fixed cost)."""
        return (self._onednn and tokens > 1 and w13.device.type == "cpu"
                and w13.dtype in self._packable
                and w13.shape[1] * w13.shape[2] >= self._min_pack_elements)

    def _packs(self, w13: torch.Tensor, w2: torch.Tensor) -> _Packed:
        key = id(w13)
        entry = self._packed.get(key)
        if entry is not None and entry.valid_for(w13, w2):
            return entry
        reorder = torch.ops.mkldnn._reorder_linear_weight
        with torch.no_grad():
            experts = tuple((reorder(w13[e].detach().contiguous(), None),
                             reorder(w2[e].detach().contiguous(), None))
                            for e in range(w13.shape[0]))
        # Dropped with the weights (the callback), so a freed model's copies do not linger.
        forget = _forget(weakref.ref(self), key)
        entry = _Packed(weakref.ref(w13, forget), weakref.ref(w2), (_stamp(w13), _stamp(w2)),
                        experts)
        self._packed[key] = entry
        return entry

    def __call__(self, hidden: torch.Tensor, w13: torch.Tensor, w2: torch.Tensor,
                 topk_weights: torch.Tensor, topk_ids: torch.Tensor,
                 activation: str = "silu") -> torch.Tensor:
        experts, _, top_k = check_moe_args(hidden, w13, w2, topk_weights, topk_ids)
        check_activation(activation)
        if not self.uses_onednn(w13, hidden.shape[0]):
            return grouped_moe(hidden, w13, w2, topk_weights, topk_ids, experts, top_k,
                               activation)
        out = torch.zeros(hidden.shape, dtype=torch.float32, device=hidden.device)
        if hidden.shape[0] == 0:
            return out.to(hidden.dtype)
        packed = self._packs(w13, w2).experts
        linear = torch.ops.mkldnn._linear_pointwise
        order, counts = sort_by_expert(topk_ids, experts)
        token_of_pair = order // top_k
        rows = hidden[token_of_pair]                 # every pair's input, grouped by expert
        downs = []
        start = 0
        for expert, count in enumerate(counts):
            if count == 0:
                continue
            end = start + count
            gate_up = linear(rows[start:end], packed[expert][0], None, "none", [], "")
            act = gated_activation(gate_up, activation)
            downs.append(linear(act, packed[expert][1], None, "none", [], ""))
            start = end
        down = torch.cat(downs) if len(downs) > 1 else downs[0]
        weight_of_pair = topk_weights.reshape(-1).to(torch.float32)[order]
        out.index_add_(0, token_of_pair, down.to(torch.float32) * weight_of_pair[:, None])
        return out.to(hidden.dtype)


def _forget(owner_ref: weakref.ref, key: int) -> Callable[[object], None]:
    def callback(_dead: object) -> None:
        owner = owner_ref()
        if owner is not None:
            owner._packed.pop(key, None)
    return callback
