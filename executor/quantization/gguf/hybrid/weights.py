"""A hybrid GGUF file's tensors put back as the Hugging Face checkpoint holds them, undoing
llama.cpp's converter:

- Qwen3.5 with fewer key heads than value heads: the converter reorders the value heads
  from grouped by key head (k0: v0 v1, k1: v2 v3) to tiled (v0 v2 v1 v3) in in_proj_qkv's
  value rows, in_proj_z's rows, in_proj_a/b's rows, A_log, dt_bias, the convolution's value
  channels and out_proj's columns: put back grouped;
- A_log is stored as ssm_a = -exp(A_log): the float32 A_log whose -exp is that value
  exactly is searched for (within a few units in the last place of the logarithm), so the
  decay Folio computes is the converter's, bit for bit;
- the convolutions' weights [C, 1, K] are stored squeezed [C, K];
- Qwen3.5's zero-centred norms are stored as their scale 1 + weight: kept as stored, and
  the hybrid loader makes those norms multiply by the weight itself (hybrid/loader.py),
  since weight = scale - 1 is not exact in float32 for every scale.

The multi-token-prediction block a Qwen3.5 file may carry (blk.N and above) is skipped."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from folio.executor.quantization.gguf.file import field
from folio.executor.quantization.gguf.hybrid.names import hybrid_hf_name, layer_index


@dataclass(frozen=True)
class HybridLayout:
    family: str           # "lfm2" or "qwen35"
    num_layers: int       # trunk layers (a Qwen3.5 file's MTP block comes after them)
    k_heads: int = 0      # Qwen3.5's Gated DeltaNet
    v_heads: int = 0
    k_dim: int = 0
    v_dim: int = 0
    reorders_v_heads: bool = True   # Qwen3.5's converter does, Qwen3-Next's does not

    @property
    def tiled(self) -> bool:
        """Whether the converter reordered the value heads."""
        return self.reorders_v_heads and 0 < self.k_heads != self.v_heads


def hybrid_layout(reader: Any, arch: str, family: str) -> HybridLayout:
    if family in ("lfm2", "lfm2moe"):
        return HybridLayout(family, field(reader, f"{arch}.block_count"))
    # Qwen3.5, Qwen3.5-MoE and Qwen3-Next
    v_heads = field(reader, f"{arch}.ssm.time_step_rank")
    return HybridLayout(
        family, field(reader, f"{arch}.block_count")
        - field(reader, f"{arch}.nextn_predict_layers", 0),
        field(reader, f"{arch}.ssm.group_count"), v_heads,
        field(reader, f"{arch}.ssm.state_size"),
        field(reader, f"{arch}.ssm.inner_size") // v_heads, family != "qwen3next")


def trunk_name(layout: HybridLayout, gguf_name: str) -> str | None:
    """The Hugging Face name of a tensor Folio loads; None for the MTP block's. ValueError
    for one with no place (validate.py refused those already)."""
    layer = layer_index(gguf_name)
    if layer is not None and layer >= layout.num_layers:
        return None
    name = hybrid_hf_name(layout.family, gguf_name)
    if name is None:
        raise ValueError(f"GGUF tensor {gguf_name!r} has no place in Folio's {layout.family}")
    return name


def grouped_order(layout: HybridLayout, unit: int) -> np.ndarray:
    """Indices into the tiled order, in grouped order: grouped[i] = tiled[order[i]]."""
    per_k = layout.v_heads // layout.k_heads
    return np.arange(per_k * layout.k_heads * unit).reshape(
        per_k, layout.k_heads, unit).transpose(1, 0, 2).reshape(-1)


def row_order(layout: HybridLayout, name: str) -> np.ndarray | None:
    """The rows' (or a 1-D tensor's items') order back to Hugging Face's; None if unchanged."""
    if not layout.tiled or ".linear_attn." not in name:
        return None
    if name.endswith(("in_proj_qkv.weight", "conv1d.weight")):
        keys = 2 * layout.k_heads * layout.k_dim
        return np.concatenate((np.arange(keys), keys + grouped_order(layout, layout.v_dim)))
    if name.endswith("in_proj_z.weight"):
        return grouped_order(layout, layout.v_dim)
    if name.endswith(("in_proj_a.weight", "in_proj_b.weight", "A_log", "dt_bias")):
        return grouped_order(layout, 1)
    return None


def column_order(layout: HybridLayout, name: str) -> np.ndarray | None:
    """out_proj's input columns (the value heads) back to grouped order."""
    if layout.tiled and name.endswith("linear_attn.out_proj.weight"):
        return grouped_order(layout, layout.v_dim)
    return None


def hybrid_tensor(layout: HybridLayout, name: str, values: np.ndarray) -> np.ndarray:
    """A dequantized float32 tensor (numpy's dim order), as the checkpoint holds `name`."""
    rows = row_order(layout, name)
    if rows is not None:
        values = values[rows]
    columns = column_order(layout, name)
    if columns is not None:
        values = values[:, columns]
    if name.endswith("A_log"):
        values = a_log_from_a(values, name)
    if name.endswith(("conv1d.weight", "conv.conv.weight")):
        values = values[:, None, :]   # [C, K] -> the checkpoint's [C, 1, K]
    if name.endswith("shared_expert_gate.weight"):
        values = values.reshape(1, -1)   # llama.cpp reads it as [H]
    return values


def a_log_from_a(a: np.ndarray, name: str) -> np.ndarray:
    """The float32 A_log whose -exp (as torch computes it, over the whole vector) is `a`."""
    a = np.asarray(a, dtype=np.float32)
    if not (np.isfinite(a).all() and (a < 0).all()):
        raise ValueError(f"GGUF tensor for {name} (ssm_a = -exp(A_log)) must be negative "
                         "and finite")
    target = torch.from_numpy(-a)
    guess = torch.from_numpy(np.log(-a.astype(np.float64)).astype(np.float32))
    found = guess.clone()
    done = torch.exp(guess) == target
    for direction in (float("inf"), float("-inf")):
        candidate = guess.clone()
        for _ in range(4):
            candidate = torch.nextafter(candidate, torch.full_like(candidate, direction))
            hit = (torch.exp(candidate) == target) & ~done
            found[hit] = candidate[hit]
            done |= hit
    return found.numpy()


def iterate_hybrid_weights(reader: Any, arch: str, family: str
                           ) -> Iterator[tuple[str, torch.Tensor]]:
    from gguf.quants import dequantize

    layout = hybrid_layout(reader, arch, family)
    for tensor in reader.tensors:
        name = trunk_name(layout, tensor.name)
        if name is None:
            continue
        values = dequantize(tensor.data, tensor.tensor_type).astype(np.float32, copy=False)
        values = hybrid_tensor(layout, name, values)
        if "*" in name:   # stacked experts: one tensor each, as transformers saves them
            for expert, part in enumerate(values):
                yield name.replace("*", str(expert)), torch.from_numpy(part.copy())
            continue
        values = np.ascontiguousarray(values)
        if not values.flags.writeable:   # an F32 tensor is a view of the read-only map
            values = values.copy()
        yield name, torch.from_numpy(values)
