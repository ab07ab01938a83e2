"""Python faces of the fused CPU operators in kernels/cpu/fused_ops.cpp.

Each has the meaning of its torch reference in kernels.reference (rms_norm_ref, rotary_ref,
silu_and_mul_ref, reshape_and_cache_ref);
they are built and loaded with the attention operator
(kernels.cpu_attention), so `cpu_attention.load().ok` says whether they can run.
"""

from __future__ import annotations

import torch

from folio.kernels.reference import reshape_and_cache_ref, silu_and_mul_ref


def rms_norm_cpu(x: torch.Tensor, weight: torch.Tensor, eps: float,
                 residual: torch.Tensor | None = None
                 ) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
    """As rms_norm_ref. With `residual`, x and residual are updated in place (x becomes the
    normed sum, residual the sum), which is what the decoder layer does with them next."""
    if residual is None:
        out = torch.empty_like(x)
        torch.ops.folio.rms_norm(out, x, weight, float(eps))
        return out
    torch.ops.folio.fused_add_rms_norm(x, residual, weight, float(eps))
    return x, residual


def rotary_cpu(positions: torch.Tensor, query: torch.Tensor, key: torch.Tensor,
               cos_sin_cache: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """As rotary_ref, rotating query and key in place."""
    torch.ops.folio.rotary(positions, query, key, cos_sin_cache)
    return query, key


def silu_and_mul_cpu(gate_up: torch.Tensor) -> torch.Tensor:
    """As silu_and_mul_ref, in one pass over gate_up."""
    if gate_up.dim() != 2 or gate_up.stride(-1) != 1:
        return silu_and_mul_ref(gate_up)
    out = torch.empty(gate_up.shape[0], gate_up.shape[1] // 2, dtype=gate_up.dtype)
    torch.ops.folio.silu_and_mul(out, gate_up)
    return out


def reshape_and_cache_cpu(key: torch.Tensor, value: torch.Tensor, key_cache: torch.Tensor,
                          value_cache: torch.Tensor, slot_mapping: torch.Tensor) -> None:
    """As reshape_and_cache_ref: one copy per token where the layouts allow (each token's
    heads contiguous, the caches contiguous, one dtype), one quantizing pass per token into
    an int8 / float8 / bfloat16 cache (kernels/cpu/kv_write.cpp), else the reference."""
    if (key_cache.dtype in _STORED and key.dtype in (torch.float32, torch.bfloat16)
            and key.dtype == value.dtype and value_cache.dtype == key_cache.dtype
            and key.dtype != key_cache.dtype and _heads_packed(key) and _heads_packed(value)
            and key_cache.is_contiguous() and value_cache.is_contiguous()):
        torch.ops.folio.quantize_and_cache(key, value, key_cache, value_cache,
                                           slot_mapping.contiguous())
        return
    if (key.dtype != key_cache.dtype or value.dtype != value_cache.dtype
            or not _heads_packed(key) or not _heads_packed(value)
            or not key_cache.is_contiguous() or not value_cache.is_contiguous()):
        reshape_and_cache_ref(key, value, key_cache, value_cache, slot_mapping)
        return
    torch.ops.folio.reshape_and_cache(key, value, key_cache, value_cache,
                                      slot_mapping.contiguous())


# Cache types the C++ write quantizes into (kernels/kv_quant.py's rows).
_STORED = (torch.int8, torch.float8_e4m3fn, torch.float8_e5m2, torch.bfloat16)


def _heads_packed(rows: torch.Tensor) -> bool:
    return rows.dim() == 3 and rows.stride(2) == 1 and rows.stride(1) == rows.shape[2]
