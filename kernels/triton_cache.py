"""reshape_and_cache: scatter new tokens' keys and values into the paged KV cache.

Meaning: `reference.reshape_and_cache_ref`. One program per token copies all of its KV heads
(Hkv x D contiguous elements when the input is packed) for both key and value; a negative slot
marks a padding token and its program writes nothing.
"""

from __future__ import annotations

import math

import torch
import triton
import triton.language as tl

from folio.kernels._checks import (FLOAT_DTYPES, INDEX_DTYPES, KV_QUANTIZED_DTYPES,
                                   check_inner_contiguous, check_same_device, check_shape,
                                   check_tensor)
from folio.kernels._launch import check_launch_device, next_power_of_2, on_device
from folio.kernels.kv_quant import is_fp8, row_width


@triton.jit
def _reshape_and_cache_kernel(
    key_ptr, value_ptr, key_cache_ptr, value_cache_ptr, slot_mapping_ptr,
    stride_key_token, stride_key_head, stride_value_token, stride_value_head,
    stride_kc_block, stride_kc_slot, stride_kc_head,
    stride_vc_block, stride_vc_slot, stride_vc_head,
    num_kv_heads, key_scale_ptr, value_scale_ptr,
    HEAD_DIM: tl.constexpr, BLOCK_SIZE: tl.constexpr,
    HEADS_PAD: tl.constexpr, DIM_PAD: tl.constexpr,
    KV_INT8: tl.constexpr, FP8_LIMIT: tl.constexpr, FP8_MANTISSA: tl.constexpr,
    FP8_MIN_EXP: tl.constexpr,
):
    token = tl.program_id(0).to(tl.int64)
    slot = tl.load(slot_mapping_ptr + token).to(tl.int64)
    if slot < 0:
        return
    block = slot // BLOCK_SIZE
    offset = slot % BLOCK_SIZE

    heads = tl.arange(0, HEADS_PAD)[:, None]
    dims = tl.arange(0, DIM_PAD)[None, :]
    mask = (heads < num_kv_heads) & (dims < HEAD_DIM)

    key = tl.load(key_ptr + token * stride_key_token + heads * stride_key_head + dims,
                  mask=mask)
    value = tl.load(value_ptr + token * stride_value_token + heads * stride_value_head + dims,
                    mask=mask)
    key_dst = key_cache_ptr + block * stride_kc_block + offset * stride_kc_slot
    value_dst = value_cache_ptr + block * stride_vc_block + offset * stride_vc_slot
    if KV_INT8:
        row = tl.arange(0, HEADS_PAD)
        key_rows = block * stride_kc_block + offset * stride_kc_slot + row * stride_kc_head
        value_rows = block * stride_vc_block + offset * stride_vc_slot + row * stride_vc_head
        _store_int8_rows(key_cache_ptr, key_scale_ptr, key_rows, key, mask, row < num_kv_heads,
                         HEAD_DIM, DIM_PAD)
        _store_int8_rows(value_cache_ptr, value_scale_ptr, value_rows, value, mask,
                         row < num_kv_heads, HEAD_DIM, DIM_PAD)
    elif FP8_LIMIT > 0:
        tl.store(key_dst + heads * stride_kc_head + dims,
                 _round_to_fp8(key, FP8_MANTISSA, FP8_MIN_EXP, FP8_LIMIT)
                 .to(key_cache_ptr.dtype.element_ty), mask=mask)
        tl.store(value_dst + heads * stride_vc_head + dims,
                 _round_to_fp8(value, FP8_MANTISSA, FP8_MIN_EXP, FP8_LIMIT)
                 .to(value_cache_ptr.dtype.element_ty), mask=mask)
    else:
        tl.store(key_dst + heads * stride_kc_head + dims,
                 key.to(key_cache_ptr.dtype.element_ty), mask=mask)
        tl.store(value_dst + heads * stride_vc_head + dims,
                 value.to(value_cache_ptr.dtype.element_ty), mask=mask)


@triton.jit
def _round_to_fp8(values, MANTISSA: tl.constexpr, MIN_EXP: tl.constexpr, LIMIT: tl.constexpr):
    """values rounded half-to-even onto the float8 grid (MANTISSA bits, normals from
    2^MIN_EXP, subnormals below), saturated at +-LIMIT, as float32: the cast that follows is
    then exact, whatever rounding the conversion itself uses (triton's interpreter truncates
    and flushes subnormals; kv_quant's torch cast rounds to nearest even)."""
    x = values.to(tl.float32)
    exponent = ((x.to(tl.int32, bitcast=True) >> 23) & 0xFF) - 127
    step_exp = tl.maximum(exponent, MIN_EXP) - MANTISSA
    step = ((step_exp + 127) << 23).to(tl.float32, bitcast=True)   # 2^step_exp, exact
    steps = (x / step + 12582912.0) - 12582912.0   # round half to even; |x / step| < 2^5
    rounded = tl.clamp(steps * step, -LIMIT, LIMIT)
    return tl.where(x < 0, -tl.abs(rounded), rounded)   # keeps -0.0


@triton.jit
def _store_int8_rows(cache_ptr, scale_ptr, rows, values, mask, row_valid,
                     HEAD_DIM: tl.constexpr, DIM_PAD: tl.constexpr):
    """kv_quant's int8 rows at element offsets `rows` of the cache: scale = max|x| / 127
    rounded to float16 (then used as the divisor, so the stored scale is exactly the one
    applied), q = round-half-even(x / scale) clamped to +-127, and the scale's two bytes
    after the row's HEAD_DIM values (scale_ptr is the cache viewed as float16)."""
    dims = tl.arange(0, DIM_PAD)[None, :]
    x = tl.where(mask, values.to(tl.float32), 0.0)
    amax = tl.max(tl.abs(x), 1)
    scale = tl.minimum(amax / 127.0, 65504.0).to(tl.float16)
    divisor = tl.where(scale.to(tl.float32) > 0, scale.to(tl.float32), 1.0)
    scaled = x / divisor[:, None]
    # Round half to even by the float32 magic number (|scaled| <= 127, far below 2^22).
    rounded = (scaled + 12582912.0) - 12582912.0
    q = tl.clamp(rounded, -127.0, 127.0).to(tl.int8)
    tl.store(cache_ptr + rows[:, None] + dims, q, mask=mask)
    tl.store(scale_ptr + (rows + HEAD_DIM) // 2, scale, mask=row_valid)


def _fp8_grid(dtype: torch.dtype) -> dict:
    """The float8 format's grid for _round_to_fp8 (FP8_LIMIT 0: not float8)."""
    if not is_fp8(dtype):
        return {"FP8_LIMIT": 0.0, "FP8_MANTISSA": 0, "FP8_MIN_EXP": 0}
    info = torch.finfo(dtype)
    mantissa = round(-math.log2(info.eps))
    return {"FP8_LIMIT": float(info.max), "FP8_MANTISSA": mantissa,
            "FP8_MIN_EXP": round(math.log2(info.tiny))}


def reshape_and_cache(key: torch.Tensor, value: torch.Tensor, key_cache: torch.Tensor,
                      value_cache: torch.Tensor, slot_mapping: torch.Tensor) -> None:
    """Write key/value [T, Hkv, D] into caches [N, B, Hkv, D] at flat slots; skip slots < 0.

    slot_mapping[i] = block_id * B + offset (int32 or int64). Slots must be < N * B; that is
    not checked (it would need a device sync). Keys are cast to the cache dtype, or quantized
    where the cache is stored so (kernels/kv_quant.py: int8 rows [.., D + 2] with a float16
    scale, D even; float8 clamped to its finite range), as kv_quant.quantize_rows does.
    """
    check_tensor("key", key, ndim=3, dtypes=FLOAT_DTYPES)
    check_tensor("value", value, ndim=3, dtypes=FLOAT_DTYPES)
    check_tensor("key_cache", key_cache, ndim=4, dtypes=FLOAT_DTYPES + KV_QUANTIZED_DTYPES)
    check_tensor("value_cache", value_cache, ndim=4, dtypes=FLOAT_DTYPES + KV_QUANTIZED_DTYPES)
    if value_cache.dtype != key_cache.dtype:
        raise TypeError(f"value_cache dtype {value_cache.dtype} differs from key_cache dtype "
                        f"{key_cache.dtype}")
    check_tensor("slot_mapping", slot_mapping, ndim=1, dtypes=INDEX_DTYPES)
    num_tokens, num_kv_heads, head_dim = key.shape
    block_size = key_cache.shape[1]
    check_shape("value", value, key.shape)
    kv_int8 = key_cache.dtype == torch.int8
    if kv_int8 and head_dim % 2:
        raise ValueError(f"an int8 KV cache needs an even head_dim, got {head_dim}")
    check_shape("key_cache", key_cache, (None, None, num_kv_heads,
                                         row_width(key_cache.dtype, head_dim)))
    check_shape("value_cache", value_cache, key_cache.shape)
    check_shape("slot_mapping", slot_mapping, (num_tokens,))
    check_same_device("key", key, value=value, key_cache=key_cache, value_cache=value_cache,
                      slot_mapping=slot_mapping)
    for name, tensor in (("key", key), ("value", value), ("key_cache", key_cache),
                         ("value_cache", value_cache)):
        check_inner_contiguous(name, tensor)
    if not slot_mapping.is_contiguous():
        raise ValueError("slot_mapping must be contiguous")
    check_launch_device("key", key, _reshape_and_cache_kernel)
    if num_tokens == 0:
        return

    heads_pad, dim_pad = next_power_of_2(num_kv_heads), next_power_of_2(head_dim)
    num_warps = 1 if heads_pad * dim_pad <= 256 else 4 if heads_pad * dim_pad <= 4096 else 8
    with on_device(key):
        _reshape_and_cache_kernel[(num_tokens,)](
            key, value, key_cache, value_cache, slot_mapping,
            key.stride(0), key.stride(1), value.stride(0), value.stride(1),
            key_cache.stride(0), key_cache.stride(1), key_cache.stride(2),
            value_cache.stride(0), value_cache.stride(1), value_cache.stride(2),
            num_kv_heads,
            *((key_cache.view(torch.float16), value_cache.view(torch.float16)) if kv_int8
              else (key_cache, value_cache)),
            HEAD_DIM=head_dim, BLOCK_SIZE=block_size, HEADS_PAD=heads_pad, DIM_PAD=dim_pad,
            KV_INT8=kv_int8,
            **_fp8_grid(key_cache.dtype),
            num_warps=num_warps,
        )
