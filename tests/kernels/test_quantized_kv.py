"""Quantized KV caches (kernels/kv_quant.py): the row round trip, the C++ operator reading
quantized blocks in place against the float64 oracle over the dequantized cache, and the
attention error against the float cache."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from folio.kernels import cpu_attention, reference
from folio.kernels.kv_quant import dequantize_rows, kv_storage_dtype, quantize_rows, row_width
from tests.kernels.paged_batch import make_batch, oracle, relative_error

CPU = torch.device("cpu")
STORED = ["bfloat16", "int8", "fp8_e4m3", "fp8_e5m2"]
# Attention output error against the float32 cache (max abs / max abs), random N(0, 1) K/V:
# measured 0.003 (bfloat16), 0.006-0.007 (int8), 0.04 (fp8_e4m3), 0.08-0.10 (fp8_e5m2).
ERROR_AGAINST_FLOAT = {"bfloat16": 0.01, "int8": 0.02, "fp8_e4m3": 0.08, "fp8_e5m2": 0.2}
SEQS = [(40, 1), (0, 23), (20, 9), (0, 1), (31, 1), (3, 30), (70, 1), (100, 70), (0, 131)]

pytestmark = pytest.mark.usefixtures("cpu_ops_built")


def quantized(batch, kv_cache_dtype: str):
    """`batch` with its caches stored as kv_cache_dtype, and the same batch whose float32
    caches hold exactly the values the quantized ones stand for (the oracle's input)."""
    storage = kv_storage_dtype(kv_cache_dtype, batch.query.dtype)
    head_dim = batch.query.shape[-1]
    stored = dataclasses.replace(batch, key_cache=quantize_rows(batch.key_cache, storage),
                                 value_cache=quantize_rows(batch.value_cache, storage))
    exact = dataclasses.replace(
        batch, key_cache=dequantize_rows(stored.key_cache, head_dim).float(),
        value_cache=dequantize_rows(stored.value_cache, head_dim).float())
    return stored, exact


@pytest.mark.parametrize("kv_cache_dtype", STORED)
@pytest.mark.parametrize("shape", [(16, 64, 4, 4), (32, 128, 8, 2), (4, 40, 6, 3),
                                   (16, 32, 4, 1)],
                         ids=["mha-d64", "gqa4-d128", "gqa2-d40-generic", "mqa-d32"])
def test_cpu_operator_reads_quantized_blocks(kv_cache_dtype, shape):
    block_size, head_dim, heads, kv_heads = shape
    batch = make_batch(SEQS, block_size=block_size, head_dim=head_dim, num_heads=heads,
                       num_kv_heads=kv_heads, dtype=torch.float32, device=CPU, seed=head_dim)
    stored, exact = quantized(batch, kv_cache_dtype)
    out = torch.full_like(batch.query, float("nan"))
    cpu_attention.paged_attention_cpu(*stored.args(), out=out)
    assert relative_error(out, oracle(exact)) < 1e-4
    # The torch reference (the executor's torch path) reads them alike.
    assert relative_error(reference.paged_attention_ref(*stored.args()), oracle(exact)) < 1e-4
    assert relative_error(out, oracle(batch)) < ERROR_AGAINST_FLOAT[kv_cache_dtype]


@pytest.mark.parametrize("kv_cache_dtype", STORED)
@pytest.mark.parametrize("window, softcap", [(8, None), (33, 5.0), (None, 3.0)])
def test_window_and_softcap(kv_cache_dtype, window, softcap):
    batch = make_batch(SEQS, block_size=16, head_dim=64, num_heads=6, num_kv_heads=2,
                       dtype=torch.float32, device=CPU, seed=3, window=window)
    stored, exact = quantized(batch, kv_cache_dtype)
    out = cpu_attention.paged_attention_cpu(*stored.args(), window=window, softcap=softcap)
    assert relative_error(out, oracle(exact, window, softcap)) < 1e-4


@pytest.mark.parametrize("kv_cache_dtype", ["int8", "fp8_e4m3"])
def test_bfloat16_queries(kv_cache_dtype):
    batch = make_batch(SEQS[:7], block_size=16, head_dim=64, num_heads=4, num_kv_heads=2,
                       dtype=torch.bfloat16, device=CPU, seed=1)
    stored, exact = quantized(batch, kv_cache_dtype)
    out = cpu_attention.paged_attention_cpu(*stored.args())
    assert out.dtype == torch.bfloat16
    assert relative_error(out, oracle(exact)) < 1.6e-2


def test_int8_round_trip_error_is_within_half_a_step():
    rows = torch.randn(64, 3, 64) * torch.logspace(-3, 3, 64)[:, None, None]
    stored = quantize_rows(rows, torch.int8)
    assert stored.shape == (64, 3, row_width(torch.int8, 64)) == (64, 3, 66)
    back = dequantize_rows(stored, 64)
    step = rows.abs().amax(-1, keepdim=True) / 127
    # Half a quantization step, plus the float16 rounding of the scale (2^-11 relative).
    assert bool(((back - rows).abs() <= step * (0.5 + 127 * 2**-11) + 1e-12).all())
    zero = dequantize_rows(quantize_rows(torch.zeros(2, 1, 64), torch.int8), 64)
    assert bool((zero == 0).all())


@pytest.mark.parametrize("kv_cache_dtype, relative", [("fp8_e4m3", 2**-4), ("fp8_e5m2", 2**-3)])
def test_fp8_round_trip_saturates_instead_of_nan(kv_cache_dtype, relative):
    storage = kv_storage_dtype(kv_cache_dtype, torch.float32)
    rows = torch.randn(32, 2, 64) * 4
    back = dequantize_rows(quantize_rows(rows, storage), 64)
    assert bool(((back - rows).abs() <= rows.abs() * relative + 2**-9).all())
    huge = dequantize_rows(quantize_rows(torch.full((1, 1, 64), 1e9), storage), 64)
    assert bool(torch.isfinite(huge).all()) and float(huge.max()) == torch.finfo(storage).max


def test_cpu_fp8_widening_matches_torch_for_every_byte():
    """Every finite float8 pattern, through the operator's register widening: a cache of
    one key whose values are those patterns; with one value row of ones and a zero query
    the output is the values, so put the patterns in V instead."""
    for storage in (torch.float8_e4m3fn, torch.float8_e5m2):
        patterns = torch.arange(256, dtype=torch.uint8).view(storage)
        finite = patterns[torch.isfinite(patterns.float())]
        head_dim = 32                                       # the vector loads
        values = torch.zeros(-(-finite.numel() // head_dim) * head_dim, dtype=storage)
        values[:finite.numel()] = finite
        rows = values.view(-1, 1, head_dim)                   # one token per row
        count = rows.shape[0]
        value_cache = rows.view(count, 1, 1, head_dim)        # one-token blocks
        key_cache = torch.zeros_like(value_cache)
        for token in range(count):
            out = cpu_attention.paged_attention_cpu(
                torch.zeros(1, 1, head_dim), key_cache, value_cache,
                torch.tensor([[token]], dtype=torch.int32), torch.tensor([1]),
                torch.tensor([0, 1]), 1.0)
            assert torch.equal(out[0, 0], rows[token, 0].float()), (storage, token)


def test_operator_refuses_a_row_width_that_does_not_fit():
    batch = make_batch([(3, 1)], block_size=4, head_dim=64, num_heads=2, num_kv_heads=2,
                       dtype=torch.float32, device=CPU, seed=0)
    narrow = batch.key_cache.to(torch.int8)       # int8 without room for the scales
    with pytest.raises(RuntimeError, match="66 wide"):
        cpu_attention.paged_attention_cpu(batch.query, narrow, narrow, *batch.args()[3:])


def write_inputs(dtype: torch.dtype, tokens: int, top: int):
    """(key, value [tokens, 3, 64], slots into 8 blocks of 16) for a cache write test: wide
    magnitudes up to 10^top (float8's saturation, int8's float16 scale), exact zeros, a tie,
    a padded token (slot -1)."""
    gen = torch.Generator().manual_seed(7)
    key = (torch.randn(tokens, 3, 64, generator=gen)
           * torch.logspace(-4, top, tokens)[:, None, None]).to(dtype)
    key[3] = 0.0
    key[4, 0, :2] = torch.tensor([127.0, 0.5])      # amax 127: a scale of 1, a tie at 0.5
    value = torch.randn(tokens, 3, 64, generator=gen).to(dtype) * 1e3
    slots = torch.randperm(8 * 16, generator=gen)[:tokens]
    slots[5] = -1                                    # a padded token: not written
    return key, value, slots


@pytest.mark.parametrize("kv_cache_dtype", STORED)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_cpu_write_matches_the_reference_bit_for_bit(kv_cache_dtype, dtype):
    if kv_cache_dtype == "bfloat16" and dtype == torch.bfloat16:
        pytest.skip("the model's own type: a plain copy")
    storage = kv_storage_dtype(kv_cache_dtype, dtype)
    key, value, slots = write_inputs(dtype, tokens=37, top=3)
    shape = (8, 16, key.shape[1], row_width(storage, key.shape[2]))
    caches = [torch.zeros(shape).to(storage) for _ in range(4)]
    reference.reshape_and_cache_ref(key, value, caches[0], caches[1], slots)
    torch.ops.folio.quantize_and_cache(key, value, caches[2], caches[3], slots.to(torch.int32))
    for expected, actual in ((caches[0], caches[2]), (caches[1], caches[3])):
        assert torch.equal(expected.view(torch.uint8), actual.view(torch.uint8))
