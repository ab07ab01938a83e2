"""A pre-quantized checkpoint's linear layers (compressed-tensors int8, AWQ, GPTQ) kept
quantized on the CPU executor, re-expressed exactly as Folio's formats
(executor/quantization/weight_only_linear.py):

- compressed-tensors int-quantized: `weight` int8 [N, K] and `weight_scale` ([N, 1] per
  channel, [N, K / g] per group, one value per tensor) are Folio's int8 as they are;
  pack-quantized: `weight_packed` int32 [N, K * bits / 32], values q + 2 ** (bits - 1) in
  order along K from the low bits (`weight_shape` [N, K]): int4 is Folio's int4 with min
  -8 * scale, int8 is Folio's int8 v - 128.
- AWQ (GEMM): `qweight` int32 [K, N / 8], eight int4 along N in the order 0, 2, 4, 6, 1, 3, 5,
  7 from the low nibble; `qzeros` int32 [K / g, N / 8] packed the same way; `scales`
  [K / g, N]. w = (q - z) * s is Folio's int4 with scale s and min -z * s.
- GPTQ: `qweight` int32 [K * bits / 32, N], values in order along K from the low bits;
  `qzeros` int32 [K / g, N * bits / 32] in order along N, stored as z - 1 in the classic
  "gptq" format (as z in "gptq_v2"); `scales` [K / g, N]; `g_idx` [K] must be k // g.
  int4 maps like AWQ; symmetric int8 (every z = 128) is Folio's int8 q - 128.

With float16 or bfloat16 scales both forms of w are exact in float32, so a kept layer holds
exactly the weight the format defines. The model is built with these layers as
PendingQuantizedLinear (no float weight allocated; executor/model_loader.py skips their
tensors), then each is swapped for a WeightOnlyLinear: no float copy of a quantized matrix is
ever made.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from pathlib import Path

import torch
from torch import nn

from folio.executor.quantization.prequantized_config import PrequantScheme
from folio.executor.quantization.weight_only_linear import QuantizedWeight, WeightOnlyLinear
from folio.executor.weights import checkpoint_tensor_names, iterate_weights
from folio.kernels.cpu_quant import pack_int4

log = logging.getLogger("folio.executor")

_PACKED_PARTS = ("qweight", "qzeros", "scales", "g_idx")          # AWQ and GPTQ
_CT_PARTS = ("weight_scale", "weight_zero_point", "input_scale", "input_zero_point",
             "weight_packed", "weight_shape", "weight_g_idx")
# AWQ's nibble i holds column _AWQ_ORDER[i] of each eight; column c sits in nibble
# _AWQ_COLUMN_NIBBLE[c].
_AWQ_ORDER = (0, 2, 4, 6, 1, 3, 5, 7)
_AWQ_COLUMN_NIBBLE = tuple(_AWQ_ORDER.index(c) for c in range(8))


def quantized_module(name: str, tensor: torch.Tensor, scheme: PrequantScheme) -> str | None:
    """The module a checkpoint tensor is a quantized part of ("model.layers.0.mlp.up_proj"),
    or None for an ordinary float tensor (embeddings, norms, biases, an ignored layer)."""
    module, _, leaf = name.rpartition(".")
    if scheme.method == "compressed-tensors":
        if leaf in _CT_PARTS or (leaf == "weight" and tensor.dtype == torch.int8):
            return module
        return None
    return module if leaf in _PACKED_PARTS else None


# A module holding one of these is quantized in the file (read from the headers alone).
_MARKERS = ("qweight", "weight_packed", "weight_scale")


def quantized_params(model_dir: str | Path, weight_names) -> set[str]:
    """Folio's weight parameters ("layers.0.self_attn.qkv_proj.weight") that the checkpoint
    holds quantized, from the tensor names alone."""
    modules = {name.rpartition(".")[0] for name in checkpoint_tensor_names(model_dir)
               if name.rpartition(".")[2] in _MARKERS}
    targets = (weight_names.target(f"{module}.weight") for module in modules)
    return {target[0] for target in targets if target is not None and target[1] is None}


class PendingQuantizedLinear(nn.Module):
    """Stands in for an nn.Linear whose weight the file holds quantized, so that no float
    weight is ever allocated for it: it holds only the bias until keep_prequantized swaps
    it for a WeightOnlyLinear."""

    def __init__(self, linear: nn.Linear) -> None:
        super().__init__()
        self.in_features, self.out_features = linear.in_features, linear.out_features
        self.bias = linear.bias

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        raise RuntimeError("a pre-quantized layer was never swapped for its quantized weight")


def leave_unallocated(model: nn.Module, params: set[str]) -> None:
    """Replace each nn.Linear whose weight is in `params` by a PendingQuantizedLinear (on the
    meta model, before its parameters are allocated)."""
    modules = dict(model.named_modules())
    for param_name in params:
        module_name = param_name.rsplit(".", 1)[0]
        if isinstance(modules.get(module_name), nn.Linear):
            parent_name, _, child = module_name.rpartition(".")
            setattr(modules[parent_name] if parent_name else model, child,
                    PendingQuantizedLinear(modules[module_name]))


def unpack_int32(packed: torch.Tensor, bits: int) -> torch.Tensor:
    """int32 [..., M] -> int32 [..., M * 32 / bits], values in order from the low bits."""
    per = 32 // bits
    shifts = torch.arange(0, 32, bits, dtype=torch.int32)
    values = (packed.to(torch.int32)[..., None] >> shifts) & ((1 << bits) - 1)
    return values.reshape(*packed.shape[:-1], packed.shape[-1] * per)


def _awq_unpack(packed: torch.Tensor) -> torch.Tensor:
    values = unpack_int32(packed, 4).reshape(*packed.shape, 8)
    return values[..., list(_AWQ_COLUMN_NIBBLE)].reshape(packed.shape[0], -1)


def _int4(q_kn: torch.Tensor, zeros: torch.Tensor, scales: torch.Tensor) -> QuantizedWeight:
    """q [K, N], zeros and scales [K / g, N] -> Folio's int4 [N, K]."""
    scales = scales.float().T.contiguous()
    mins = (-zeros.float().T * scales).contiguous()
    return QuantizedWeight(4, pack_int4(q_kn.T.to(torch.uint8).contiguous()), scales, mins)


def awq_weight(parts: dict[str, torch.Tensor]) -> QuantizedWeight:
    return _int4(_awq_unpack(parts["qweight"]), _awq_unpack(parts["qzeros"]), parts["scales"])


def gptq_weight(parts: dict[str, torch.Tensor], scheme: PrequantScheme) -> QuantizedWeight:
    bits = scheme.bits
    packed = parts["qweight"]
    q = unpack_int32(packed.T.contiguous(), bits).T            # [K, N]
    k, n = q.shape
    zeros = unpack_int32(parts["qzeros"], bits)[:, :n]          # [K / g, N]
    if scheme.checkpoint_format == "gptq":
        zeros = (zeros + 1) & ((1 << bits) - 1) if bits == 4 else zeros + 1
    scales = parts["scales"]
    group = k // scales.shape[0]
    g_idx = parts.get("g_idx")
    if g_idx is not None and not torch.equal(g_idx.to(torch.int64),
                                             torch.arange(k) // group):
        raise ValueError("GPTQ act-order with a g_idx other than the trivial order is not "
                         "supported")
    if bits == 4:
        return _int4(q, zeros, scales)
    if not bool((zeros == 128).all()):
        raise ValueError("GPTQ int8 with zero points other than 128 (asymmetric) does not map "
                         "onto Folio's symmetric int8")
    data = (q - 128).to(torch.int8).T.contiguous()
    return QuantizedWeight(8, data, scales.float().T.contiguous(), None)


def compressed_weight(parts: dict[str, torch.Tensor], scheme: PrequantScheme
                      ) -> QuantizedWeight:
    """compressed-tensors: int8 `weight` [N, K] (int-quantized), or `weight_packed` int32
    [N, K * bits / 32] holding q + 2 ** (bits - 1) in order along K (pack-quantized), with
    `weight_scale` [N, 1], [N, K / g] or one value."""
    zero = parts.get("weight_zero_point")
    if zero is not None and bool((zero != 0).any()):
        raise ValueError("compressed-tensors with nonzero weight_zero_point (asymmetric) does "
                         "not map onto Folio's symmetric weights")
    if scheme.checkpoint_format == "pack-quantized":
        n, k = (int(size) for size in parts["weight_shape"])
        values = unpack_int32(parts["weight_packed"], scheme.bits)[:, :k]
    else:
        values = parts["weight"]
        n, k = values.shape
    scales = parts["weight_scale"].float()
    if scales.numel() == 1:   # per tensor
        scales = scales.reshape(1, 1).expand(n, 1)
    scales = scales.reshape(n, -1).contiguous()
    g_idx = parts.get("weight_g_idx")
    if g_idx is not None and not torch.equal(
            g_idx.to(torch.int64), torch.arange(k) // (k // scales.shape[1])):
        raise ValueError("compressed-tensors act-order with a g_idx other than the trivial "
                         "order is not supported")
    if scheme.checkpoint_format == "int-quantized":
        return QuantizedWeight(8, values.contiguous(), scales, None)
    if scheme.bits == 8:
        return QuantizedWeight(8, (values - 128).to(torch.int8).contiguous(), scales, None)
    return QuantizedWeight(4, pack_int4(values.to(torch.uint8)), scales, -8 * scales)


def quantized_weight(parts: dict[str, torch.Tensor], scheme: PrequantScheme) -> QuantizedWeight:
    """One layer's tensors (by leaf name) -> its weight in Folio's format."""
    if scheme.method == "awq":
        return awq_weight(parts)
    if scheme.method == "gptq":
        return gptq_weight(parts, scheme)
    return compressed_weight(parts, scheme)


def iterate_quantized(model_dir: str | Path, scheme: PrequantScheme
                      ) -> Iterator[tuple[str, QuantizedWeight]]:
    """("<module>.weight", its weight) for each quantized layer of the checkpoint."""
    modules: dict[str, dict[str, torch.Tensor]] = {}
    for name, tensor in iterate_weights(model_dir):
        module = quantized_module(name, tensor, scheme)
        if module is not None:
            modules.setdefault(module, {})[name.rpartition(".")[2]] = tensor
    for module in list(modules):
        parts = modules.pop(module)
        needed = (("qweight", "qzeros", "scales") if scheme.method != "compressed-tensors"
                  else ("weight_packed", "weight_shape", "weight_scale")
                  if scheme.checkpoint_format == "pack-quantized" else ("weight", "weight_scale"))
        missing = [leaf for leaf in needed if leaf not in parts]
        if missing:
            raise ValueError(f"pre-quantized checkpoint: {module} lacks {', '.join(missing)}")
        yield f"{module}.weight", quantized_weight(parts, scheme)


def keep_prequantized(model: nn.Module, model_dir: str | Path, scheme: PrequantScheme,
                      weight_names, native: bool, int8_activations: bool = False) -> int:
    """Swap each nn.Linear the checkpoint holds quantized for a WeightOnlyLinear (fused q/k/v
    and gate/up from their parts). Returns how many were swapped."""
    parts: dict[str, dict[int | None, QuantizedWeight]] = {}
    for name, weight in iterate_quantized(model_dir, scheme):
        target = weight_names.target(name)
        if target is None or target[1] is not None:
            raise ValueError(f"pre-quantized checkpoint: {name} has no place for a quantized "
                             "weight (experts are not supported)")
        param_name, _, part = target
        parts.setdefault(param_name, {})[part] = weight
    modules = dict(model.named_modules())
    for param_name, found in parts.items():
        module_name = param_name.rsplit(".", 1)[0]
        linear = modules.get(module_name)
        if not isinstance(linear, (nn.Linear, PendingQuantizedLinear)):
            raise ValueError(f"pre-quantized checkpoint: {param_name} is not a linear layer")
        ordered = [found[key] for key in sorted(found, key=lambda key: key or 0)]
        weight = QuantizedWeight.concatenate(ordered) if len(ordered) > 1 else ordered[0]
        needed = (linear.out_features, linear.in_features)
        if weight.shape != needed:
            raise ValueError(f"pre-quantized checkpoint: {param_name} unpacks to "
                             f"{weight.shape}, the model needs {needed}")
        bias = None if linear.bias is None else linear.bias.detach().clone()
        parent_name, _, child = module_name.rpartition(".")
        setattr(modules[parent_name] if parent_name else model, child,
                WeightOnlyLinear(weight, bias, native, int8_activations))
    pending = [name for name, module in model.named_modules()
               if isinstance(module, PendingQuantizedLinear)]
    if pending:
        raise ValueError(f"pre-quantized checkpoint: {len(pending)} quantized layer(s) or "
                         f"part(s) of them missing, e.g. {pending[:3]}")
    log.info("pre-quantized checkpoint: %d linear layers kept as %s", len(parts),
             scheme.describe())
    return len(parts)
