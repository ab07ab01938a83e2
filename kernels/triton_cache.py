"""reshape_and_cache: scatter new tokens' keys and values into the paged KV cache.

Meaning: `reference.reshape_and_cache_ref`. One program per token copies all of its KV heads
(Hkv x D contiguous elements when the input is packed) for both key and value; a negative slot
marks a padding token and its program writes nothing.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from folio.kernels._checks import (FLOAT_DTYPES, INDEX_DTYPES, check_inner_contiguous,
                             check_same_device, check_shape, check_tensor)
from folio.kernels._launch import check_launch_device, next_power_of_2, on_device


@triton.jit
def _reshape_and_cache_kernel(
    key_ptr, value_ptr, key_cache_ptr, value_cache_ptr, slot_mapping_ptr,
    stride_key_token, stride_key_head, stride_value_token, stride_value_head,
    stride_kc_block, stride_kc_slot, stride_kc_head,
    stride_vc_block, stride_vc_slot, stride_vc_head,
    num_kv_heads,
    HEAD_DIM: tl.constexpr, BLOCK_SIZE: tl.constexpr,
    HEADS_PAD: tl.constexpr, DIM_PAD: tl.constexpr,
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
    tl.store(key_dst + heads * stride_kc_head + dims,
             key.to(key_cache_ptr.dtype.element_ty), mask=mask)
    tl.store(value_dst + heads * stride_vc_head + dims,
             value.to(value_cache_ptr.dtype.element_ty), mask=mask)


def reshape_and_cache(key: torch.Tensor, value: torch.Tensor, key_cache: torch.Tensor,
                      value_cache: torch.Tensor, slot_mapping: torch.Tensor) -> None:
    """Write key/value [T, Hkv, D] into caches [N, B, Hkv, D] at flat slots; skip slots < 0.

    slot_mapping[i] = block_id * B + offset (int32 or int64). Slots must be < N * B; that is
    not checked (it would need a device sync). Keys are cast to the cache dtype.
    """
    check_tensor("key", key, ndim=3, dtypes=FLOAT_DTYPES)
    check_tensor("value", value, ndim=3, dtypes=FLOAT_DTYPES)
    check_tensor("key_cache", key_cache, ndim=4, dtypes=FLOAT_DTYPES)
    check_tensor("value_cache", value_cache, ndim=4, dtypes=FLOAT_DTYPES)
    check_tensor("slot_mapping", slot_mapping, ndim=1, dtypes=INDEX_DTYPES)
    num_tokens, num_kv_heads, head_dim = key.shape
    block_size = key_cache.shape[1]
    check_shape("value", value, key.shape)
    check_shape("key_cache", key_cache, (None, None, num_kv_heads, head_dim))
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
            HEAD_DIM=head_dim, BLOCK_SIZE=block_size, HEADS_PAD=heads_pad, DIM_PAD=dim_pad,
            num_warps=num_warps,
        )
