"""A GGUF file's quantized linear weights kept as they are in the file (CPU executor).

Q8_0 blocks are the int8 kernel's format with groups of 32 (its scale, no requantization);
Q4_0, Q4_1 and Q4_K are re-expressed exactly as the int4 format's groups of 32 (a scale and
a min each: Q4_0's min is -8 * d, Q4_K's are d * sc and -dmin * m of each sub-block), so the
kept layer computes what the dequantized one does, to float rounding. Every other type
(F32/F16/BF16, Q5_*, Q2_K/Q3_K/Q5_K/Q6_K) stays dequantized to --dtype by the loader.

This happens whenever a GGUF file is served on the CPU (the file's quantization is what
llama.cpp and vLLM users expect to get), with or without --quantization; --quantization
then only quantizes the linears the file holds in float or in another type.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import torch
from torch import nn

from folio.executor.quantization.gguf.config import gguf_architecture
from folio.executor.quantization.gguf.file import field, open_gguf
from folio.executor.quantization.gguf.names import CONFIG_TENSORS, hf_name
from folio.executor.quantization.gguf.weights import unpermute_rows
from folio.executor.quantization.weight_only_linear import QuantizedWeight, WeightOnlyLinear
from folio.kernels.cpu_quant import pack_int4

log = logging.getLogger("folio.executor")

KEPT_TYPES = ("Q8_0", "Q4_0", "Q4_1", "Q4_K")
_BLOCK_BYTES = {"Q8_0": 34, "Q4_0": 18, "Q4_1": 20, "Q4_K": 144}


def _half(blocks: np.ndarray, at: int) -> np.ndarray:
    """The float16 at byte `at` of each block, as float32 [rows, blocks]."""
    return np.ascontiguousarray(blocks[..., at:at + 2]).view(np.float16)[..., 0].astype(
        np.float32)


def _q8_0(blocks: np.ndarray) -> QuantizedWeight:
    rows = blocks.shape[0]
    q = np.ascontiguousarray(blocks[..., 2:]).view(np.int8).reshape(rows, -1)
    return QuantizedWeight(8, torch.from_numpy(q.copy()), torch.from_numpy(_half(blocks, 0)),
                           None)


def _int4(values: np.ndarray, scales: np.ndarray, mins: np.ndarray) -> QuantizedWeight:
    """values uint8 [rows, K] (0..15), scales and mins [rows, K // 32]."""
    return QuantizedWeight(4, pack_int4(torch.from_numpy(values)),
                           torch.from_numpy(np.ascontiguousarray(scales, dtype=np.float32)),
                           torch.from_numpy(np.ascontiguousarray(mins, dtype=np.float32)))


def _q4_blocks(blocks: np.ndarray, at: int) -> np.ndarray:
    """Q4_0/Q4_1's 16 bytes per block (value i low, i + 16 high) as values [rows, K]."""
    qs = blocks[..., at:at + 16]
    return np.concatenate((qs & 0xF, qs >> 4), axis=-1).reshape(blocks.shape[0], -1)


def _q4_0(blocks: np.ndarray) -> QuantizedWeight:
    d = _half(blocks, 0)
    return _int4(_q4_blocks(blocks, 2), d, -8 * d)


def _q4_1(blocks: np.ndarray) -> QuantizedWeight:
    return _int4(_q4_blocks(blocks, 4), _half(blocks, 0), _half(blocks, 2))


def _q4_k(blocks: np.ndarray) -> QuantizedWeight:
    """256 values a block: d, dmin, 12 bytes of 6-bit (sc, m) for 8 sub-blocks of 32, then
    4 chunks of 32 bytes, each holding sub-block 2c (low nibbles) and 2c + 1 (high)."""
    rows, count = blocks.shape[:2]
    d, dmin = _half(blocks, 0)[..., None], _half(blocks, 2)[..., None]
    packed = blocks[..., 4:16].astype(np.uint8)
    sc = np.empty((rows, count, 8), dtype=np.uint8)
    m = np.empty_like(sc)
    sc[..., :4] = packed[..., 0:4] & 63
    m[..., :4] = packed[..., 4:8] & 63
    sc[..., 4:] = (packed[..., 8:12] & 0xF) | ((packed[..., 0:4] >> 6) << 4)
    m[..., 4:] = (packed[..., 8:12] >> 4) | ((packed[..., 4:8] >> 6) << 4)
    qs = blocks[..., 16:].reshape(rows, count, 4, 32)
    values = np.stack((qs & 0xF, qs >> 4), axis=3).reshape(rows, -1)   # sub-block order
    scales = (d * sc.astype(np.float32)).reshape(rows, -1)
    mins = (-(dmin * m.astype(np.float32))).reshape(rows, -1)
    return _int4(values, scales, mins)


_CONVERTERS = {"Q8_0": _q8_0, "Q4_0": _q4_0, "Q4_1": _q4_1, "Q4_K": _q4_k}


def quantized_weight(data: np.ndarray, type_name: str) -> QuantizedWeight:
    """A GGUF tensor's raw bytes [rows, row bytes] of a KEPT_TYPES type, re-expressed."""
    rows = data.shape[0]
    blocks = np.asarray(data, dtype=np.uint8).reshape(rows, -1, _BLOCK_BYTES[type_name])
    return _CONVERTERS[type_name](blocks)


def iterate_kept_weights(path: str | Path) -> Iterator[tuple[str, QuantizedWeight]]:
    """(Hugging Face name, weight) of each 2-D tensor of a KEPT_TYPES type, q and k rows in
    Hugging Face's order."""
    reader = open_gguf(path)
    arch, spec = gguf_architecture(reader)
    if spec.hybrid is not None:
        yield from _hybrid_kept_weights(reader, arch, spec.hybrid)
        return
    if spec.layout == "gemma4":   # its own names, no rows moved (gguf/gemma4/)
        from folio.executor.quantization.gguf.gemma4.quantized import gemma4_kept_names

        for tensor, name in gemma4_kept_names(reader):
            if tensor.tensor_type.name in KEPT_TYPES:
                yield name, quantized_weight(tensor.data.reshape(int(tensor.shape[1]), -1),
                                             tensor.tensor_type.name)
        return
    heads = field(reader, f"{arch}.attention.head_count")
    kv_heads = field(reader, f"{arch}.attention.head_count_kv", heads)
    for tensor in reader.tensors:
        type_name = tensor.tensor_type.name
        if tensor.name in CONFIG_TENSORS or type_name not in KEPT_TYPES:
            continue
        name = hf_name(tensor.name, spec.layout)
        if name is None or len(tensor.shape) != 2:
            continue
        weight = quantized_weight(tensor.data.reshape(int(tensor.shape[1]), -1), type_name)
        if spec.permuted_qk and (".q_proj." in name or ".k_proj." in name):
            count = heads if ".q_proj." in name else kv_heads
            weight = QuantizedWeight(weight.bits, *(
                None if part is None else torch.from_numpy(
                    np.ascontiguousarray(unpermute_rows(part.numpy(), count)))
                for part in (weight.data, weight.scales, weight.mins)))
        yield name, weight


def _hybrid_kept_weights(reader, arch: str, family: str
                         ) -> Iterator[tuple[str, QuantizedWeight]]:
    """A hybrid file's kept tensors, rows put back in Hugging Face's order
    (gguf/hybrid/weights.py); out_proj's value-head columns too where each head is whole
    blocks (its blocks run along the columns), else it stays float."""
    from folio.executor.quantization.gguf.hybrid.weights import (column_order, hybrid_layout,
                                                                  row_order, trunk_name)

    layout = hybrid_layout(reader, arch, family)
    for tensor in reader.tensors:
        type_name = tensor.tensor_type.name
        if type_name not in KEPT_TYPES or len(tensor.shape) != 2:
            continue
        name = trunk_name(layout, tensor.name)
        reordered = name is not None and column_order(layout, name) is not None
        if name is None or (reordered and layout.v_dim % 32):
            continue
        weight = quantized_weight(tensor.data.reshape(int(tensor.shape[1]), -1), type_name)
        if reordered:
            weight = _grouped_columns(weight, layout)
        rows = row_order(layout, name)
        if rows is not None:
            weight = QuantizedWeight(weight.bits, *(
                None if part is None else part[torch.from_numpy(rows)].contiguous()
                for part in (weight.data, weight.scales, weight.mins)))
        yield name, weight


def _grouped_columns(weight: QuantizedWeight, layout) -> QuantizedWeight:
    """out_proj's columns, one value head of whole 32-value blocks each, back in grouped
    order: the int8 values (or packed int4 bytes, 16 a block) and each block's scale and
    min move with their head."""
    from folio.executor.quantization.gguf.hybrid.weights import grouped_order

    def moved(part: torch.Tensor | None, unit: int) -> torch.Tensor | None:
        if part is None:
            return None
        return part[:, torch.from_numpy(grouped_order(layout, unit))].contiguous()

    data_unit = layout.v_dim // 2 if weight.bits == 4 else layout.v_dim
    block_unit = layout.v_dim // weight.group
    return QuantizedWeight(weight.bits, moved(weight.data, data_unit),
                           moved(weight.scales, block_unit), moved(weight.mins, block_unit))


def keep_gguf_quantized(model: nn.Module, path: str | Path, weight_names, native: bool,
                        tie_word_embeddings: bool, int8_activations: bool = False) -> int:
    """Swap each nn.Linear of `model` whose whole weight is held in KEPT_TYPES in the file
    (all parts of a fused one, in one format) for a WeightOnlyLinear on those blocks; a tied
    lm_head takes the embedding's. Returns how many were swapped."""
    parts: dict[str, dict[int | None, QuantizedWeight]] = {}
    for name, weight in iterate_kept_weights(path):
        target = weight_names.target(name)
        if target is None or target[1] is not None:   # experts stay dequantized
            continue
        param_name, _, part = target
        parts.setdefault(param_name, {})[part] = weight
    if tie_word_embeddings and "embed_tokens.weight" in parts:
        parts["lm_head.weight"] = parts["embed_tokens.weight"]
    modules = dict(model.named_modules())
    swapped = 0
    for param_name, found in parts.items():
        linear = modules.get(param_name.rsplit(".", 1)[0])
        if not isinstance(linear, nn.Linear):
            continue
        ordered = [found[key] for key in sorted(found, key=lambda key: key or 0)]
        if len({(p.bits, p.group) for p in ordered}) != 1:
            continue   # parts in different formats: stays float
        weight = QuantizedWeight.concatenate(ordered) if len(ordered) > 1 else ordered[0]
        if weight.shape != tuple(linear.weight.shape):
            continue   # a fused layer with a part in another type
        bias = None if linear.bias is None else linear.bias.detach().clone()
        parent_name, _, child = param_name.rsplit(".", 1)[0].rpartition(".")
        setattr(modules[parent_name] if parent_name else model, child,
                WeightOnlyLinear(weight, bias, native, int8_activations))
        swapped += 1
    log.info("GGUF: %d linear layers kept quantized as in the file", swapped)
    return swapped
