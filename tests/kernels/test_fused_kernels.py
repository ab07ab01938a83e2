"""Triton RMSNorm (with and without the residual add) and rotary embedding vs the references."""

from __future__ import annotations

import pytest
import torch

from folio import kernels
from folio.kernels import fused_add_rms_norm, rms_norm, rotary_embedding

# One unit in the last place: the kernels round like the references, but a sum in another
# order or a hardware rsqrt may move a result across a rounding boundary.
ULP = {torch.float32: 2e-6, torch.float16: 2 ** -10, torch.bfloat16: 2 ** -7}


def close(actual, expected):
    torch.testing.assert_close(actual.cpu(), expected, rtol=ULP[expected.dtype], atol=1e-6)


@pytest.mark.parametrize("shape, dtype, weight_dtype", [
    ((5, 96), torch.float32, torch.float32),
    ((2, 3, 128), torch.bfloat16, torch.bfloat16),
    ((4, 200), torch.float16, torch.float16),
    ((3, 64), torch.bfloat16, torch.float32),        # fp32 weight: promoted fp32 output
])
def test_rms_norm(device, shape, dtype, weight_dtype):
    gen = torch.Generator().manual_seed(shape[-1])
    x = (3 * torch.randn(shape, generator=gen)).to(dtype)
    residual = torch.randn(shape, generator=gen).to(dtype)
    weight = (1 + torch.randn(shape[-1], generator=gen) / 4).to(weight_dtype)
    eps = 1e-5

    expected = kernels.rms_norm_ref(x, weight, eps)
    actual = rms_norm(x.to(device), weight.to(device), eps)
    assert actual.dtype == expected.dtype and actual.shape == expected.shape
    close(actual, expected)

    expected_normed, expected_sum = kernels.rms_norm_ref(x, weight, eps, residual)
    for normed, summed in (rms_norm(x.to(device), weight.to(device), eps, residual.to(device)),
                           fused_add_rms_norm(x.to(device), residual.to(device),
                                              weight.to(device), eps)):
        close(normed, expected_normed)
        torch.testing.assert_close(summed.cpu(), expected_sum, rtol=0, atol=0)


def test_rms_norm_leaves_inputs_alone(device):
    x = torch.randn(4, 64, device=device)
    residual = torch.randn(4, 64, device=device)
    before = (x.clone(), residual.clone())
    fused_add_rms_norm(x, residual, torch.ones(64, device=device), 1e-6)
    assert torch.equal(x, before[0]) and torch.equal(residual, before[1])


def cos_sin_cache(max_positions: int, head_dim: int) -> torch.Tensor:
    inv_freq = 1.0 / (10000 ** (torch.arange(0, head_dim, 2).float() / head_dim))
    freqs = torch.arange(max_positions).float()[:, None] * inv_freq[None, :]
    return torch.cat((freqs.cos(), freqs.sin()), dim=-1)


@pytest.mark.parametrize("num_heads, num_kv_heads, head_dim, dtype", [
    (4, 2, 64, torch.float32),
    (6, 1, 96, torch.bfloat16),
    (2, 2, 32, torch.float16),
])
def test_rotary(device, num_heads, num_kv_heads, head_dim, dtype):
    gen = torch.Generator().manual_seed(head_dim)
    tokens = 7
    positions = torch.randint(0, 64, (tokens,), generator=gen)
    cache = cos_sin_cache(64, head_dim)
    # q and k as the executor passes them: strided views of one fused projection.
    fused = torch.randn(tokens, (num_heads + 2 * num_kv_heads) * head_dim, generator=gen)
    fused = fused.to(dtype)
    q = fused[:, :num_heads * head_dim].view(tokens, num_heads, head_dim)
    k = fused[:, num_heads * head_dim:(num_heads + num_kv_heads) * head_dim]
    k = k.view(tokens, num_kv_heads, head_dim)
    expected_q, expected_k = kernels.rotary_ref(positions, q, k, cache)

    args = (positions.to(device), q.to(device), k.to(device), cache.to(device))
    actual_q, actual_k = rotary_embedding(*args)
    close(actual_q, expected_q)
    close(actual_k, expected_k)

    q_copy, k_copy = q.contiguous().to(device), k.contiguous().to(device)
    result = rotary_embedding(positions.to(device), q_copy, k_copy, cache.to(device),
                              inplace=True)
    assert result[0] is q_copy and result[1] is k_copy
    close(q_copy, expected_q)
    close(k_copy, expected_k)
