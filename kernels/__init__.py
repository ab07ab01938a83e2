"""Attention and normalization kernels: Triton for CUDA, torch references for everywhere.

The *_ref functions (kernels.reference) define what each kernel means and are the CPU path.
The Triton launchers are loaded on first use, so importing `kernels` never imports triton:

    reshape_and_cache(key, value, key_cache, value_cache, slot_mapping) -> None
    paged_attention(query, key_cache, value_cache, block_tables, seq_lens, query_start_loc,
                    scale, out=None, *, max_seq_len=None, config=None) -> out
    rms_norm(x, weight, eps, residual=None) -> normed | (normed, x + residual)
    fused_add_rms_norm(x, residual, weight, eps) -> (normed, x + residual)
    rotary_embedding(positions, query, key, cos_sin_cache, *, inplace=False) -> (query, key)
    fused_moe(hidden, w13, w2, topk_weights, topk_ids, activation="silu", *, config=None) -> out
    AttentionConfig, MoEConfig: optional launch parameters of paged_attention, fused_moe

They run on CUDA tensors, or on CPU tensors when TRITON_INTERPRET=1 was set before triton was
first imported (tests). `triton_available(device)` says whether they can run there.
"""

from __future__ import annotations

import importlib
import importlib.util
import os
from typing import Any

# Every name loads on first use, and this file imports nothing of Folio's: run from the
# repository root, another program that imports a `kernels` (Hugging Face's, say) finds this
# folder first, and it must import cleanly there and refuse names it lacks (ImportError).
_REFERENCE_EXPORTS = ("paged_attention_ref", "reshape_and_cache_ref", "rms_norm_ref",
                      "rotary_ref")
_TRITON_EXPORTS = {
    "reshape_and_cache": "folio.kernels.triton_cache",
    "paged_attention": "folio.kernels.triton_attention",
    "AttentionConfig": "folio.kernels.triton_attention",
    "rms_norm": "folio.kernels.triton_norm",
    "fused_add_rms_norm": "folio.kernels.triton_norm",
    "rotary_embedding": "folio.kernels.triton_rotary",
    "fused_moe": "folio.kernels.triton_moe",
    "MoEConfig": "folio.kernels.triton_moe",
}

# The Triton names stay out of __all__ so that `from kernels import *` never needs triton.
__all__ = ["paged_attention_ref", "reshape_and_cache_ref", "rms_norm_ref", "rotary_ref",
           "triton_available"]


def triton_available(device: Any = "cuda") -> bool:
    """Whether the Triton kernels can run on tensors of `device` (no triton import).

    CUDA needs triton installed and a CUDA device; CPU needs the triton interpreter, which
    must be switched on (TRITON_INTERPRET=1) before triton is first imported.
    """
    if importlib.util.find_spec("triton") is None:
        return False
    device_type = device if isinstance(device, str) else getattr(device, "type", str(device))
    device_type = device_type.split(":", 1)[0]
    if device_type == "cuda":
        import torch
        return torch.cuda.is_available()
    interpret = os.environ.get("TRITON_INTERPRET", "0").strip().lower() in ("1", "true", "on",
                                                                             "yes")
    return device_type == "cpu" and interpret


def __getattr__(name: str) -> Any:
    module_name = ("folio.kernels.reference" if name in _REFERENCE_EXPORTS
                   else _TRITON_EXPORTS.get(name))
    if module_name is None:
        raise AttributeError(f"module 'kernels' has no attribute {name!r}")
    value = getattr(importlib.import_module(module_name), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_REFERENCE_EXPORTS) | set(_TRITON_EXPORTS))
