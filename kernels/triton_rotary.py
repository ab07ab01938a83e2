"""rotary_embedding: neox-style rotary position embedding of query and key, one token a program.

Meaning: `reference.rotary_ref`, rounding included: cos and sin are cast to the input dtype,
and each product and the sum are rounded to it, as torch computes
`x * cos + rotate_half(x) * sin` in that dtype. cos_sin_cache [max_pos, D] holds cos in
its first D/2 columns and sin in the rest.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from folio.kernels._checks import (FLOAT_DTYPES, INDEX_DTYPES, check_contiguous,
                             check_inner_contiguous, check_same_device, check_shape,
                             check_tensor)
from folio.kernels._launch import check_launch_device, next_power_of_2, on_device, round_to


@triton.jit
def _rotate_heads(x_ptr, out_ptr, stride_token, stride_head, stride_out_token,
                  stride_out_head, token, num_heads, cos, sin,
                  HALF: tl.constexpr, HEADS_PAD: tl.constexpr, HALF_PAD: tl.constexpr):
    heads = tl.arange(0, HEADS_PAD)[:, None]
    cols = tl.arange(0, HALF_PAD)[None, :]
    mask = (heads < num_heads) & (cols < HALF)
    src = x_ptr + token * stride_token + heads * stride_head + cols
    x1 = tl.load(src, mask=mask, other=0.0)
    x2 = tl.load(src + HALF, mask=mask, other=0.0)
    dtype = x_ptr.dtype.element_ty
    x1, x2 = x1.to(tl.float32), x2.to(tl.float32)
    # Round each step to the input dtype, like the reference's element-wise torch ops.
    first = round_to(round_to(x1 * cos, dtype) - round_to(x2 * sin, dtype), dtype)
    second = round_to(round_to(x2 * cos, dtype) + round_to(x1 * sin, dtype), dtype)
    dst = out_ptr + token * stride_out_token + heads * stride_out_head + cols
    tl.store(dst, first.to(out_ptr.dtype.element_ty), mask=mask)
    tl.store(dst + HALF, second.to(out_ptr.dtype.element_ty), mask=mask)


@triton.jit
def _rotary_kernel(
    positions_ptr, query_ptr, key_ptr, cos_sin_ptr, query_out_ptr, key_out_ptr,
    stride_q_token, stride_q_head, stride_k_token, stride_k_head,
    stride_qo_token, stride_qo_head, stride_ko_token, stride_ko_head, stride_cos_sin,
    num_heads, num_kv_heads,
    HALF: tl.constexpr, HALF_PAD: tl.constexpr,
    HEADS_PAD: tl.constexpr, KV_HEADS_PAD: tl.constexpr,
):
    token = tl.program_id(0).to(tl.int64)
    position = tl.load(positions_ptr + token).to(tl.int64)
    cols = tl.arange(0, HALF_PAD)[None, :]
    row = cos_sin_ptr + position * stride_cos_sin + cols
    dtype = query_ptr.dtype.element_ty
    cos = round_to(tl.load(row, mask=cols < HALF, other=0.0).to(tl.float32), dtype)
    sin = round_to(tl.load(row + HALF, mask=cols < HALF, other=0.0).to(tl.float32), dtype)
    _rotate_heads(query_ptr, query_out_ptr, stride_q_token, stride_q_head, stride_qo_token,
                  stride_qo_head, token, num_heads, cos, sin, HALF, HEADS_PAD, HALF_PAD)
    _rotate_heads(key_ptr, key_out_ptr, stride_k_token, stride_k_head, stride_ko_token,
                  stride_ko_head, token, num_kv_heads, cos, sin, HALF, KV_HEADS_PAD, HALF_PAD)


def rotary_embedding(positions: torch.Tensor, query: torch.Tensor, key: torch.Tensor,
                     cos_sin_cache: torch.Tensor, *, inplace: bool = False
                     ) -> tuple[torch.Tensor, torch.Tensor]:
    """Neox-style rotary embedding. positions [T] int; query [T, H, D]; key [T, Hkv, D];
    cos_sin_cache [max_pos, D]. Returns rotated (query, key): new tensors, or query and key
    themselves when inplace=True. Positions must be < max_pos (not checked: device sync)."""
    check_tensor("positions", positions, ndim=1, dtypes=INDEX_DTYPES)
    check_tensor("query", query, ndim=3, dtypes=FLOAT_DTYPES)
    check_tensor("key", key, ndim=3, dtypes=(query.dtype,))
    check_tensor("cos_sin_cache", cos_sin_cache, ndim=2, dtypes=FLOAT_DTYPES)
    num_tokens, num_heads, head_dim = query.shape
    if head_dim % 2:
        raise ValueError(f"query head_dim must be even, got {head_dim}")
    check_shape("key", key, (num_tokens, None, head_dim))
    check_shape("positions", positions, (num_tokens,))
    check_shape("cos_sin_cache", cos_sin_cache, (None, head_dim))
    check_same_device("query", query, positions=positions, key=key, cos_sin_cache=cos_sin_cache)
    for name, tensor in (("query", query), ("key", key), ("cos_sin_cache", cos_sin_cache)):
        check_inner_contiguous(name, tensor)
    check_contiguous("positions", positions)
    check_launch_device("query", query, _rotary_kernel)

    query_out = query if inplace else torch.empty_like(query)
    key_out = key if inplace else torch.empty_like(key)
    if num_tokens == 0:
        return query_out, key_out
    half = head_dim // 2
    heads_pad = next_power_of_2(max(num_heads, key.shape[1]))
    with on_device(query):
        _rotary_kernel[(num_tokens,)](
            positions, query, key, cos_sin_cache, query_out, key_out,
            query.stride(0), query.stride(1), key.stride(0), key.stride(1),
            query_out.stride(0), query_out.stride(1), key_out.stride(0), key_out.stride(1),
            cos_sin_cache.stride(0),
            num_heads, key.shape[1],
            HALF=half, HALF_PAD=next_power_of_2(half),
            HEADS_PAD=next_power_of_2(num_heads), KV_HEADS_PAD=next_power_of_2(key.shape[1]),
            num_warps=4 if heads_pad * half >= 1024 else 1,
        )
    return query_out, key_out
