"""A pre-quantized checkpoint's `quantization_config` (config.json), read into the one scheme
Folio can serve it with, or refused with the cause (no torch import: the command line's
checks read it before any process starts).

Three formats map exactly onto Folio's quantized weights (executor/quantization/weight_only_linear.py):
- compressed-tensors (llm-compressor) "int-quantized" int8 (W8A8) and "pack-quantized" int4 /
  int8 (W4A16, W8A16): symmetric, one scale per channel, per group or per tensor;
- AWQ (AutoAWQ's GEMM layout) int4 with zero points;
- GPTQ int4 (symmetric or not) and symmetric int8, act-order only where g_idx is the
  trivial order (checked against the file by folio/preflight.py).
Everything else is refused by name: other formats and versions, fp8, asymmetric int8,
bits other than 4/8, sparsity, a quantized KV cache, a non-trivial act-order.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

METHODS = ("compressed-tensors", "awq", "gptq")


@dataclass(frozen=True)
class PrequantScheme:
    method: str            # one of METHODS
    bits: int              # 8 or 4
    group: int | None      # input values per scale; None: one per output channel (all of K)
    zero_point: bool       # asymmetric (a zero point per group)
    # GPTQ: "gptq" (zeros stored minus one) or "gptq_v2"; compressed-tensors: its format
    checkpoint_format: str = ""
    act_order: bool = False       # GPTQ desc_act / actorder: g_idx must be the trivial order

    def describe(self) -> str:
        group = "per channel" if self.group is None else f"groups of {self.group}"
        return f"{self.method} int{self.bits} ({group})"


def read_quantization_config(raw: dict[str, Any]) -> PrequantScheme | None:
    """config.json's quantization_config -> the scheme, None without one; ValueError names
    what does not map onto Folio's formats."""
    quant = raw.get("quantization_config")
    if quant is None:
        return None
    if not isinstance(quant, dict):
        raise ValueError("quantization_config is not an object")
    method = str(quant.get("quant_method", "")).lower()
    if method == "compressed-tensors":
        return _compressed_tensors(quant)
    if method == "awq":
        return _awq(quant)
    if method == "gptq":
        return _gptq(quant)
    raise ValueError(f"pre-quantized checkpoint: quant_method {method!r} is not supported "
                     f"(Folio loads {', '.join(METHODS)})")


def _group(value: Any, method: str) -> int | None:
    if value in (None, -1, 0):
        return None
    group = int(value)
    if group % 32:
        raise ValueError(f"pre-quantized checkpoint: {method} group_size {group} is not a "
                         "multiple of 32 (Folio's quantized blocks)")
    return group


def _awq(quant: dict[str, Any]) -> PrequantScheme:
    version = str(quant.get("version", "gemm")).lower()
    if version != "gemm":
        raise ValueError(f"pre-quantized checkpoint: AWQ version {version!r} is not supported "
                         "(only AutoAWQ's 'gemm' layout)")
    bits = int(quant.get("bits", quant.get("w_bit", 4)))
    if bits != 4:
        raise ValueError(f"pre-quantized checkpoint: AWQ with {bits} bits is not supported "
                         "(4 only)")
    if not quant.get("zero_point", True):
        raise ValueError("pre-quantized checkpoint: AWQ without zero points is not supported")
    group = _group(quant.get("group_size", quant.get("q_group_size", 128)), "AWQ")
    return PrequantScheme("awq", 4, group, zero_point=True)


def _gptq(quant: dict[str, Any]) -> PrequantScheme:
    bits = int(quant.get("bits", 4))
    if bits not in (4, 8):
        raise ValueError(f"pre-quantized checkpoint: GPTQ with {bits} bits is not supported "
                         "(4 or 8)")
    fmt = str(quant.get("checkpoint_format", "gptq")).lower()
    if fmt not in ("gptq", "gptq_v2"):
        raise ValueError(f"pre-quantized checkpoint: GPTQ checkpoint_format {fmt!r} is not "
                         "supported (gptq or gptq_v2)")
    sym = bool(quant.get("sym", True))
    if bits == 8 and not sym:
        raise ValueError("pre-quantized checkpoint: asymmetric int8 (GPTQ sym false, 8 bits) "
                         "does not map onto Folio's symmetric int8 weights")
    return PrequantScheme("gptq", bits, _group(quant.get("group_size", 128), "GPTQ"),
                          zero_point=not sym or bits == 4, checkpoint_format=fmt,
                          act_order=bool(quant.get("desc_act", False)))


def _compressed_tensors(quant: dict[str, Any]) -> PrequantScheme:
    name = "pre-quantized checkpoint: compressed-tensors"
    if quant.get("sparsity_config"):
        raise ValueError(f"{name} sparsity is not supported")
    if quant.get("kv_cache_scheme"):
        raise ValueError(f"{name} kv_cache_scheme is not supported (give --kv-cache-dtype "
                         "to quantize the KV cache)")
    groups = list((quant.get("config_groups") or {}).values())
    if not groups:
        raise ValueError(f"{name} without config_groups")
    schemes = {_ct_group(group, str(group.get("format") or quant.get("format") or ""), name)
               for group in groups}
    if len(schemes) != 1:
        raise ValueError(f"{name} with config groups of different schemes is not supported")
    return schemes.pop()


def _ct_group(group: dict[str, Any], fmt: str, name: str) -> PrequantScheme:
    weights = group.get("weights") or {}
    kind = str(weights.get("type", "int"))
    if kind != "int" or "float" in fmt:
        raise ValueError(f"{name} {kind} weights (format {fmt!r}) are not supported: fp8 "
                         "schemes do not map onto Folio's int8/int4 weights")
    if fmt not in _CT_FORMATS:
        raise ValueError(f"{name} format {fmt!r} is not supported ({', '.join(_CT_FORMATS)})")
    activations = group.get("input_activations") or {}
    if activations and str(activations.get("type", "int")) != "int":
        raise ValueError(f"{name} {activations.get('type')} activations (fp8) are not "
                         "supported")
    bits = int(weights.get("num_bits", 8))
    if bits not in _CT_FORMATS[fmt]:
        raise ValueError(f"{name} {fmt} with {bits} bits is not supported "
                         f"({' or '.join(map(str, _CT_FORMATS[fmt]))})")
    if not weights.get("symmetric", True):
        raise ValueError(f"{name} asymmetric int{bits} weights are not supported (symmetric "
                         "only: Folio's int8 has no zero point)")
    strategy = str(weights.get("strategy", "channel"))
    if strategy not in ("channel", "tensor", "group"):
        raise ValueError(f"{name} weight strategy {strategy!r} is not supported (channel, "
                         "group or tensor)")
    group_size = _group(weights.get("group_size"), "compressed-tensors") \
        if strategy == "group" else None
    return PrequantScheme("compressed-tensors", bits, group_size, zero_point=False,
                          checkpoint_format=fmt,
                          act_order=weights.get("actorder") not in (None, False))


# compressed-tensors formats Folio maps, and their bits: int8 as it is, or int4/int8 values
# packed eight/four to an int32 with an offset of 8/128 (symmetric).
_CT_FORMATS = {"int-quantized": (8,), "pack-quantized": (4, 8)}
