"""Triton reshape_and_cache against the torch reference, bit for bit."""

from __future__ import annotations

import pytest
import torch

from folio import kernels
from folio.kernels import reshape_and_cache


def poisoned_caches(num_blocks, block_size, num_kv_heads, head_dim, dtype, device):
    shape = (num_blocks, block_size, num_kv_heads, head_dim)
    return (torch.full(shape, float("nan"), dtype=dtype, device=device),
            torch.full(shape, float("nan"), dtype=dtype, device=device))


@pytest.mark.parametrize("block_size, num_kv_heads, head_dim, dtype, slot_dtype", [
    (16, 1, 32, torch.float32, torch.int64),
    (32, 4, 64, torch.bfloat16, torch.int32),
    (16, 2, 128, torch.float16, torch.int64),
    (32, 3, 96, torch.float32, torch.int32),
])
def test_matches_reference(device, block_size, num_kv_heads, head_dim, dtype, slot_dtype):
    gen = torch.Generator().manual_seed(block_size + head_dim)
    num_blocks, num_tokens = 6, 21
    slots = torch.randperm(num_blocks * block_size, generator=gen)[:num_tokens]
    slots[[2, 7, 8, 20]] = -1                                      # padding tokens
    # Keys/values as the executor passes them: strided views of one fused projection.
    fused = torch.randn(num_tokens, 3 * num_kv_heads * head_dim, generator=gen).to(dtype)
    key = fused[:, :num_kv_heads * head_dim].view(num_tokens, num_kv_heads, head_dim)
    value = fused[:, 2 * num_kv_heads * head_dim:].view(num_tokens, num_kv_heads, head_dim)
    expected = poisoned_caches(num_blocks, block_size, num_kv_heads, head_dim, dtype, "cpu")
    kernels.reshape_and_cache_ref(key, value, *expected, slots)

    actual = poisoned_caches(num_blocks, block_size, num_kv_heads, head_dim, dtype, device)
    reshape_and_cache(key.to(device), value.to(device), *actual, slots.to(slot_dtype).to(device))
    for got, want in zip(actual, expected):
        torch.testing.assert_close(got.cpu(), want, rtol=0, atol=0, equal_nan=True)


def test_casts_to_cache_dtype(device):
    gen = torch.Generator().manual_seed(1)
    key = torch.randn(5, 2, 32, generator=gen)
    value = torch.randn(5, 2, 32, generator=gen)
    slots = torch.tensor([0, 17, -1, 3, 31])
    expected = poisoned_caches(2, 16, 2, 32, torch.float16, "cpu")
    kernels.reshape_and_cache_ref(key, value, *expected, slots)
    actual = poisoned_caches(2, 16, 2, 32, torch.float16, device)
    reshape_and_cache(key.to(device), value.to(device), *actual, slots.to(device))
    for got, want in zip(actual, expected):
        torch.testing.assert_close(got.cpu(), want, rtol=0, atol=0, equal_nan=True)


def test_empty_and_all_padding(device):
    caches = poisoned_caches(2, 16, 1, 32, torch.float32, device)
    reshape_and_cache(torch.ones(0, 1, 32, device=device), torch.ones(0, 1, 32, device=device),
                      *caches, torch.ones(0, dtype=torch.int64, device=device))
    reshape_and_cache(torch.ones(3, 1, 32, device=device), torch.ones(3, 1, 32, device=device),
                      *caches, torch.full((3,), -1, device=device))
    assert all(bool(cache.isnan().all()) for cache in caches)
