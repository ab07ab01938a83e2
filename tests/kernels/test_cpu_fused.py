"""The fused CPU operators (RMSNorm, RMSNorm + residual, rotary, SiLU-and-mul, the cache
write) against their torch references, on the layouts the model hands them."""

from __future__ import annotations

import pytest
import torch

from folio.executor.model_config import RopeConfig
from folio.executor.rotary import rotary_cos_sin_cache
from folio.kernels import reference
from folio.kernels.cpu_fused import (reshape_and_cache_cpu, rms_norm_cpu, rotary_cpu,
                               silu_and_mul_cpu)

pytestmark = pytest.mark.usefixtures("cpu_ops_built")

TOLERANCE = {torch.float32: dict(rtol=1e-5, atol=1e-5), torch.bfloat16: dict(rtol=2e-2, atol=2e-2)}
DTYPES = [torch.float32, torch.bfloat16]


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("rows,hidden", [(1, 64), (7, 96), (130, 512)])
def test_rms_norm_matches_reference(dtype, rows, hidden):
    torch.manual_seed(rows)
    x = torch.randn(rows, hidden).to(dtype)
    weight = torch.randn(hidden).to(dtype)
    expected = reference.rms_norm_ref(x, weight, 1e-6)
    got = rms_norm_cpu(x, weight, 1e-6)
    torch.testing.assert_close(got, expected, **TOLERANCE[dtype])
    assert got.data_ptr() != x.data_ptr()


@pytest.mark.parametrize("dtype", DTYPES)
def test_fused_add_rms_norm_updates_both_in_place(dtype):
    torch.manual_seed(1)
    x, residual = torch.randn(33, 128).to(dtype), torch.randn(33, 128).to(dtype)
    weight = torch.randn(128).to(dtype)
    normed, summed = reference.rms_norm_ref(x.clone(), weight, 1e-5, residual.clone())
    got_x, got_residual = rms_norm_cpu(x, weight, 1e-5, residual)
    assert got_x is x and got_residual is residual
    torch.testing.assert_close(residual, summed, **TOLERANCE[dtype])
    torch.testing.assert_close(x, normed, **TOLERANCE[dtype])


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("heads,kv_heads,head_dim", [(8, 4, 64), (4, 1, 32), (2, 2, 128)])
def test_rotary_matches_reference_on_views_of_the_fused_projection(dtype, heads, kv_heads,
                                                                   head_dim):
    torch.manual_seed(head_dim)
    tokens = 19
    table = rotary_cos_sin_cache(RopeConfig(theta=10000.0), head_dim, 256, torch.device("cpu"))
    qkv = torch.randn(tokens, (heads + 2 * kv_heads) * head_dim).to(dtype)
    q, k, v = qkv.split([heads * head_dim, kv_heads * head_dim, kv_heads * head_dim], dim=-1)
    q = q.view(tokens, heads, head_dim)           # strided views, as in the model
    k = k.view(tokens, kv_heads, head_dim)
    v_before = v.clone()
    positions = torch.randint(0, 256, (tokens,))
    want_q, want_k = reference.rotary_ref(positions, q.clone(), k.clone(), table)
    got_q, got_k = rotary_cpu(positions, q, k, table)
    torch.testing.assert_close(got_q, want_q, **TOLERANCE[dtype])
    torch.testing.assert_close(got_k, want_k, **TOLERANCE[dtype])
    assert torch.equal(v, v_before)               # the value columns are not touched


def test_bad_arguments_raise_clear_errors():
    x = torch.randn(4, 8)
    with pytest.raises(RuntimeError, match="weight must be a contiguous"):
        rms_norm_cpu(x, torch.ones(7), 1e-6)
    with pytest.raises(RuntimeError, match="float32 or bfloat16"):
        rms_norm_cpu(x.double(), torch.ones(8, dtype=torch.float64), 1e-6)
    table = rotary_cos_sin_cache(RopeConfig(theta=10000.0), 8, 16, torch.device("cpu"))
    q, k = torch.randn(2, 1, 8), torch.randn(2, 1, 8)
    with pytest.raises(RuntimeError, match="position 16 outside the rotary table"):
        rotary_cpu(torch.tensor([0, 16]), q, k, table)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("rows,inner", [(1, 7), (32, 1408), (5, 33)])
def test_silu_and_mul_matches_reference(dtype, rows, inner):
    torch.manual_seed(inner)
    gate_up = (torch.randn(rows, 2 * inner) * 6).to(dtype)
    gate_up[0, :3] = torch.tensor([-100.0, 0.0, 90.0]).to(dtype)   # exp's far ends
    got = silu_and_mul_cpu(gate_up)
    assert got.shape == (rows, inner) and got.dtype == dtype
    torch.testing.assert_close(got, reference.silu_and_mul_ref(gate_up), **TOLERANCE[dtype])


def test_silu_and_mul_of_a_strided_view_takes_the_reference():
    gate_up = torch.randn(4, 16)[:, ::2]   # last dim not contiguous: the operator refuses it
    torch.testing.assert_close(silu_and_mul_cpu(gate_up), reference.silu_and_mul_ref(gate_up))


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("slot_dtype", [torch.int32, torch.int64])
def test_cache_write_matches_reference_from_views_of_the_projection(dtype, slot_dtype):
    torch.manual_seed(3)
    tokens, heads, kv_heads, head_dim = 21, 8, 2, 32
    qkv = torch.randn(tokens, (heads + 2 * kv_heads) * head_dim).to(dtype)
    _, k, v = qkv.split([heads * head_dim, kv_heads * head_dim, kv_heads * head_dim], dim=-1)
    k, v = k.view(tokens, kv_heads, head_dim), v.view(tokens, kv_heads, head_dim)
    slots = torch.randperm(6 * 16)[:tokens].to(slot_dtype)
    slots[[2, 9]] = -1                                     # padding rows are skipped
    want_k = torch.zeros(6, 16, kv_heads, head_dim, dtype=dtype)
    want_v = torch.zeros_like(want_k)
    got_k, got_v = want_k.clone(), want_v.clone()
    reference.reshape_and_cache_ref(k, v, want_k, want_v, slots)
    reshape_and_cache_cpu(k, v, got_k, got_v, slots)
    assert torch.equal(got_k, want_k) and torch.equal(got_v, want_v)
    assert got_k.abs().sum() > 0


def test_cache_write_in_another_dtype_takes_the_reference():
    k, v = torch.randn(3, 1, 8), torch.randn(3, 1, 8)
    want_k = torch.zeros(2, 4, 1, 8, dtype=torch.bfloat16)
    want_v, got_k, got_v = want_k.clone(), want_k.clone(), want_k.clone()
    slots = torch.tensor([5, 0, 7])
    reference.reshape_and_cache_ref(k, v, want_k, want_v, slots)
    reshape_and_cache_cpu(k, v, got_k, got_v, slots)
    assert torch.equal(got_k, want_k) and torch.equal(got_v, want_v)


def test_cache_write_refuses_a_slot_outside_the_cache():
    k, v = torch.randn(2, 1, 8), torch.randn(2, 1, 8)
    cache = torch.zeros(2, 4, 1, 8)
    with pytest.raises(RuntimeError, match="slot 8 outside the cache of 8 slots"):
        reshape_and_cache_cpu(k, v, cache, cache.clone(), torch.tensor([1, 8]))
    with pytest.raises(RuntimeError, match="out must be"):
        torch.ops.folio.silu_and_mul(torch.empty(2, 3), torch.randn(2, 8))
