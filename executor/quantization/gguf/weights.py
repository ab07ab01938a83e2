"""A GGUF file's tensors under Hugging Face names, dequantized to float32 one at a time, q
and k rows put back in Hugging Face's order: executor/model_loader.py then places them as
it places any checkpoint's."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import numpy as np
import torch

from folio.executor.quantization.gguf.config import gguf_architecture
from folio.executor.quantization.gguf.file import field, open_gguf
from folio.executor.quantization.gguf.names import CONFIG_TENSORS, hf_name


def iterate_gguf_weights(path: str | Path) -> Iterator[tuple[str, torch.Tensor]]:
    from gguf.quants import dequantize

    reader = open_gguf(path)
    arch, spec = gguf_architecture(reader)
    if spec.hybrid is not None:   # the converter's transforms undone (gguf/hybrid/)
        from folio.executor.quantization.gguf.hybrid.weights import iterate_hybrid_weights

        yield from iterate_hybrid_weights(reader, arch, spec.hybrid)
        return
    if spec.layout == "gpt_oss":   # the experts put back together (gguf/gpt_oss/weights.py)
        from folio.executor.quantization.gguf.gpt_oss.weights import iterate_gpt_oss_weights

        yield from iterate_gpt_oss_weights(reader)
        return
    if spec.layout == "gemma4":   # its own names (gguf/gemma4/)
        from folio.executor.quantization.gguf.gemma4.weights import iterate_gemma4_weights

        yield from iterate_gemma4_weights(reader, arch)
        return
    heads = field(reader, f"{arch}.attention.head_count")
    kv_heads = field(reader, f"{arch}.attention.head_count_kv", heads)
    for tensor in reader.tensors:
        if tensor.name in CONFIG_TENSORS:
            continue
        name = hf_name(tensor.name, spec.layout)
        if name is None:   # refused already by open_gguf's checks (validate.py)
            raise ValueError(f"GGUF tensor {tensor.name!r} has no place in Folio's {arch}")
        values = dequantize(tensor.data, tensor.tensor_type).astype(np.float32, copy=False)
        if spec.permuted_qk and ".q_proj." in name:
            values = unpermute_rows(values, heads)
        elif spec.permuted_qk and ".k_proj." in name:
            values = unpermute_rows(values, kv_heads)
        if not values.flags.writeable:   # an F32 tensor is a view of the read-only map
            values = values.copy()
        yield name, torch.from_numpy(np.ascontiguousarray(values))


def unpermute_rows(values: np.ndarray, heads: int) -> np.ndarray:
    """Undo llama.cpp's converter, which interleaves the two rotary halves of each head
    (Hugging Face row half * n + i is GGUF row 2 * i + half)."""
    half = values.shape[0] // heads // 2
    return (values.reshape(heads, half, 2, *values.shape[1:]).swapaxes(1, 2)
            .reshape(values.shape))
