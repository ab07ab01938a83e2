"""The Triton kernels on quantized KV caches (on CUDA, else under triton's interpreter): the
cache write quantizes exactly as kernels/kv_quant.py does (bit for bit), and paged attention
reads int8 and float8 blocks in place, against the float64 oracle over the dequantized
cache."""

from __future__ import annotations

import pytest
import torch

from folio.kernels.kv_quant import kv_storage_dtype, quantize_rows, row_width
from folio.kernels.triton_attention import paged_attention
from folio.kernels.triton_cache import reshape_and_cache
from tests.kernels.paged_batch import make_batch, oracle, relative_error
from tests.kernels.test_quantized_kv import quantized, write_inputs

QUANTIZED = ["int8", "fp8_e4m3", "fp8_e5m2"]
SEQS = [(40, 1), (0, 23), (20, 9), (3, 30), (70, 3)]


@pytest.mark.parametrize("kv_cache_dtype, shape", [
    ("int8", (8, 40, 6, 3)), ("fp8_e4m3", (16, 128, 4, 1)), ("fp8_e5m2", (16, 64, 4, 2))],
    ids=["int8-gqa2-d40", "e4m3-mqa-d128", "e5m2-gqa2-d64"])
def test_attention_reads_quantized_blocks(kv_cache_dtype, shape, device):
    block_size, head_dim, heads, kv_heads = shape
    batch = make_batch(SEQS, block_size=block_size, head_dim=head_dim, num_heads=heads,
                       num_kv_heads=kv_heads, dtype=torch.float32, device=device, seed=head_dim)
    stored, exact = quantized(batch, kv_cache_dtype)
    out = paged_attention(*stored.args())
    assert relative_error(out, oracle(exact)) < 1e-4


@pytest.mark.parametrize("kv_cache_dtype", ["int8"])
def test_window_softcap_and_bfloat16(kv_cache_dtype, device):
    batch = make_batch(SEQS, block_size=16, head_dim=64, num_heads=4, num_kv_heads=2,
                       dtype=torch.float32, device=device, seed=5, window=33)
    stored, exact = quantized(batch, kv_cache_dtype)
    out = paged_attention(*stored.args(), window=33, softcap=5.0)
    assert relative_error(out, oracle(exact, 33, 5.0)) < 1e-4
    half = make_batch(SEQS[:3], block_size=16, head_dim=64, num_heads=4, num_kv_heads=2,
                      dtype=torch.bfloat16, device=device, seed=1)
    stored, exact = quantized(half, kv_cache_dtype)
    out = paged_attention(*stored.args())
    assert out.dtype == torch.bfloat16
    assert relative_error(out, oracle(exact)) < 1.6e-2


@pytest.mark.parametrize("kv_cache_dtype", QUANTIZED)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_write_matches_the_reference_bit_for_bit(kv_cache_dtype, dtype, device):
    storage = kv_storage_dtype(kv_cache_dtype, dtype)
    key, value, slots = write_inputs(dtype, tokens=21, top=6)
    heads = key.shape[1]
    shape = (8, 16, heads, row_width(storage, key.shape[2]))
    key_cache = torch.zeros(shape).to(storage).to(device)
    value_cache = torch.zeros(shape).to(storage).to(device)
    reshape_and_cache(key.to(device), value.to(device), key_cache, value_cache,
                      slots.to(device))
    for cache, rows in ((key_cache, key), (value_cache, value)):
        want = torch.zeros(shape).to(storage)
        written = slots >= 0
        flat = want.view(-1, heads, shape[-1])
        flat[slots[written]] = quantize_rows(rows[written], storage)
        assert torch.equal(cache.cpu().view(torch.uint8), want.view(torch.uint8))


def test_refusals_name_the_problem(device):
    batch = make_batch([(3, 1)], block_size=4, head_dim=64, num_heads=2, num_kv_heads=2,
                       dtype=torch.float32, device=device, seed=0)
    narrow = batch.key_cache.to(torch.int8)        # int8 without room for the scales
    with pytest.raises(ValueError, match="key_cache"):
        paged_attention(batch.query, narrow, narrow, *batch.args()[3:])
    stored, _ = quantized(batch, "int8")
    with pytest.raises(TypeError, match="value_cache dtype"):
        paged_attention(batch.query, stored.key_cache,
                        quantize_rows(batch.value_cache, torch.float8_e4m3fn), *batch.args()[3:])
