"""Quantized KV cache rows (the layout is shared/kv_cache_dtype.py's): the write
(quantize) and the torch reference's read (dequantize). The C++ attention operator reads
the same rows in place (kernels/cpu/paged_attention.cpp).

A cache tensor's dtype says how its rows are stored: int8 rows are [head_dim int8 | float16
scale] (the last dimension is head_dim + 2), float8 rows are plain casts, and float32 /
bfloat16 / float16 rows are the values themselves."""

from __future__ import annotations

import torch

_FP8 = {"fp8_e4m3": "float8_e4m3fn", "fp8_e5m2": "float8_e5m2"}
_FLOATS = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16}
_INT8_MAX = 127.0
_FLOAT16_MAX = 65504.0


def kv_storage_dtype(kv_cache_dtype: str, model_dtype: torch.dtype) -> torch.dtype:
    """The cache tensor's dtype for --kv-cache-dtype (auto: the model's)."""
    if kv_cache_dtype == "auto":
        return model_dtype
    if kv_cache_dtype == "int8":
        return torch.int8
    if kv_cache_dtype in _FP8:
        dtype = getattr(torch, _FP8[kv_cache_dtype], None)
        if dtype is None:
            raise ValueError(f"kv_cache_dtype={kv_cache_dtype}: torch {torch.__version__} has "
                             f"no {_FP8[kv_cache_dtype]}")
        return dtype
    if kv_cache_dtype in _FLOATS:
        return _FLOATS[kv_cache_dtype]
    raise ValueError(f"unknown kv_cache_dtype {kv_cache_dtype!r}")


def row_width(storage: torch.dtype, head_dim: int) -> int:
    """The cache's last dimension for rows of head_dim values."""
    return head_dim + 2 if storage == torch.int8 else head_dim


def is_fp8(dtype: torch.dtype) -> bool:
    return dtype.is_floating_point and dtype.itemsize == 1


def as_bytes(tensor: torch.Tensor) -> torch.Tensor:
    """float8 tensors as uint8 (the same memory): torch's CPU index_copy_ has no float8."""
    return tensor.view(torch.uint8) if is_fp8(tensor.dtype) else tensor


def quantize_rows(rows: torch.Tensor, storage: torch.dtype) -> torch.Tensor:
    """[..., D] values -> [..., row_width(storage, D)] rows of `storage`."""
    if storage == torch.int8:
        return _quantize_int8(rows)
    if is_fp8(storage):
        limit = torch.finfo(storage).max   # casts past it would be NaN (e4m3fn has no inf)
        return rows.float().clamp(-limit, limit).to(storage)
    return rows.to(storage)


def dequantize_rows(rows: torch.Tensor, head_dim: int) -> torch.Tensor:
    """Stored rows [..., W] -> values [..., head_dim]: float32 for quantized rows, else the
    rows themselves (callers compute in float32 anyway)."""
    if rows.dtype == torch.int8:
        scale = rows[..., head_dim:].contiguous().view(torch.float16).float()
        return rows[..., :head_dim].float() * scale
    if is_fp8(rows.dtype):
        return rows.float()
    return rows


def _quantize_int8(rows: torch.Tensor) -> torch.Tensor:
    values = rows.float()
    amax = values.abs().amax(dim=-1, keepdim=True)
    # The scale is rounded to float16 first, then used to quantize: the stored scale is
    # exactly the one the values were divided by.
    scale = (amax / _INT8_MAX).clamp(max=_FLOAT16_MAX).to(torch.float16)
    divisor = torch.where(scale > 0, scale.float(), torch.ones_like(amax))
    quantized = torch.round(values / divisor).clamp(-_INT8_MAX, _INT8_MAX).to(torch.int8)
    return torch.cat((quantized, scale.view(torch.int8)), dim=-1)
