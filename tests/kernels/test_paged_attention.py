"""Triton paged attention against a float64 oracle (and the torch reference against both)."""

from __future__ import annotations

import random

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from folio import kernels
from folio.kernels import AttentionConfig, paged_attention
from tests.kernels.paged_batch import make_batch, oracle, relative_error

FP32_TOLERANCE = 1e-4
# About 7x and 3x the error of the float64 result rounded to the dtype, on these inputs.
LOW_PRECISION_TOLERANCE = {torch.float16: 2e-3, torch.bfloat16: 1.6e-2}


def random_seqs(rng: random.Random, count: int, block_size: int) -> list[tuple[int, int]]:
    """(cached context, new tokens): decodes, whole prompts and chunks after earlier context,
    with lengths that are not multiples of the block size."""
    seqs = []
    for _ in range(count):
        kind = rng.choice(["decode", "prompt", "chunk"])
        while True:
            context = 0 if kind == "prompt" else rng.randint(1, 3 * block_size)
            new = 1 if kind == "decode" else rng.randint(2, 2 * block_size)
            if (context + new) % block_size:
                break
        seqs.append((context, new))
    return seqs


def run(batch, config=None) -> torch.Tensor:
    out = torch.full_like(batch.query, float("nan"))          # unwritten rows fail
    result = paged_attention(*batch.args(), out=out, config=config)
    assert result is out
    return out


# (seed, block size, head dim, query heads, KV heads, sequences, launch config)
CASES = [
    pytest.param(0, 16, 64, 4, 4, [(36, 1), (0, 23), (20, 9), (0, 1), (31, 1)], None,
                 id="mha-b16-d64-mixed"),
    pytest.param(1, 32, 128, 8, 2, None, None, id="gqa4-b32-d128-random"),
    pytest.param(2, 16, 32, 4, 1, None, None, id="mqa-b16-d32-random8"),
    # Tiles of half a cache block, the context cut in 3 (some splits of short rows empty).
    pytest.param(3, 32, 64, 6, 2, [(40, 1), (3, 30), (0, 45), (70, 1)],
                 AttentionConfig(num_splits=3, tile_size=16), id="gqa3-b32-d64-split3"),
    # Tiles of two cache blocks, a decode-only batch cut in 8 with more splits than tiles.
    pytest.param(4, 16, 128, 4, 2, [(15, 1), (47, 1), (2, 1), (93, 1)],
                 AttentionConfig(num_splits=8, tile_size=32, block_m=32),
                 id="gqa2-b16-d128-decode-split8"),
    pytest.param(5, 16, 96, 2, 1, [(0, 20), (24, 7)], None, id="mqa-b16-d96-chunks"),
    # Small cache blocks (the executor's tests use 4): one tile spans 16 of them.
    pytest.param(6, 4, 32, 4, 2, None, None, id="gqa2-b4-d32-random"),
]


@pytest.mark.parametrize("seed, block_size, head_dim, num_heads, num_kv_heads, seqs, config",
                         CASES)
def test_matches_oracle_fp32(device, seed, block_size, head_dim, num_heads, num_kv_heads, seqs,
                             config):
    rng = random.Random(seed)
    if seqs is None:
        seqs = random_seqs(rng, rng.randint(1, 8), block_size)
    batch = make_batch(seqs, block_size=block_size, head_dim=head_dim, num_heads=num_heads,
                       num_kv_heads=num_kv_heads, dtype=torch.float32, device=device, seed=seed,
                       table_dtype=rng.choice([torch.int32, torch.int64]),
                       len_dtype=rng.choice([torch.int32, torch.int64]))
    out = run(batch, config)
    assert relative_error(out, oracle(batch)) < FP32_TOLERANCE, seqs


def test_long_decode_splits_by_default(device):
    """Few programs and a long context: the default launch splits the context (split-K)."""
    from folio.kernels.triton_attention import _choose_launch

    batch = make_batch([(700, 1), (290, 1)], block_size=16, head_dim=32, num_heads=4,
                       num_kv_heads=1, dtype=torch.float32, device=device, seed=7)
    launch = _choose_launch(AttentionConfig(), num_tokens=2, num_seqs=2, num_heads=4,
                            num_kv_heads=1, head_dim=32,
                            context_bound=batch.block_tables.shape[1] * 16, device=device)
    assert launch.num_splits > 1
    assert relative_error(run(batch), oracle(batch)) < FP32_TOLERANCE


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_low_precision(device, dtype):
    batch = make_batch([(33, 1), (0, 18), (17, 6), (50, 1)], block_size=16, head_dim=64,
                       num_heads=8, num_kv_heads=2, dtype=dtype, device=device, seed=11)
    for config in (None, AttentionConfig(num_splits=4, tile_size=16)):
        out = run(batch, config)
        assert out.dtype == dtype
        assert relative_error(out, oracle(batch)) < LOW_PRECISION_TOLERANCE[dtype]


@settings(max_examples=6, deadline=None, derandomize=True)
@given(data=st.data())
def test_random_batches(data):
    """Hypothesis-drawn shapes: any mix of decodes, prompts and chunks in one launch."""
    from tests.kernels.conftest import DEVICE

    block_size = data.draw(st.sampled_from([16, 32]))
    head_dim = data.draw(st.sampled_from([32, 64]))
    num_kv_heads = data.draw(st.sampled_from([1, 2]))
    num_heads = num_kv_heads * data.draw(st.sampled_from([1, 2, 4]))
    seqs = data.draw(st.lists(
        st.tuples(st.integers(0, 50), st.integers(1, 20)), min_size=1, max_size=5))
    config = AttentionConfig(num_splits=data.draw(st.sampled_from([None, 1, 2, 5])),
                             tile_size=data.draw(st.sampled_from([None, 16, 32])))
    batch = make_batch(seqs, block_size=block_size, head_dim=head_dim, num_heads=num_heads,
                       num_kv_heads=num_kv_heads, dtype=torch.float32, device=DEVICE, seed=0)
    out = run(batch, config)
    assert relative_error(out, oracle(batch)) < FP32_TOLERANCE


@pytest.mark.parametrize("splits", [None, 2])
def test_rows_of_no_sequence_are_left_alone(device, splits):
    batch = make_batch([(20, 1), (5, 4)], block_size=16, head_dim=32, num_heads=2,
                       num_kv_heads=1, dtype=torch.float32, device=device, seed=3)
    padded = torch.cat([batch.query, torch.randn(3, 2, 32, device=device)])
    out = torch.full_like(padded, float("nan"))
    paged_attention(padded, *batch.args()[1:], out=out, config=AttentionConfig(num_splits=splits))
    assert relative_error(out[:5], oracle(batch)) < FP32_TOLERANCE
    assert bool(out[5:].isnan().all())


def test_allocates_output_when_none_given(device):
    batch = make_batch([(9, 1), (0, 5)], block_size=16, head_dim=32, num_heads=2,
                       num_kv_heads=2, dtype=torch.float32, device=device, seed=4)
    out = paged_attention(*batch.args())
    assert out.shape == batch.query.shape and out.dtype == batch.query.dtype
    assert relative_error(out, oracle(batch)) < FP32_TOLERANCE


def test_accepts_strided_query_views(device):
    """The executor passes q as a view of a fused qkv projection: strided tokens."""
    batch = make_batch([(12, 1), (3, 6)], block_size=16, head_dim=32, num_heads=4,
                       num_kv_heads=2, dtype=torch.float32, device=device, seed=5)
    tokens = batch.query.shape[0]
    fused = torch.randn(tokens, 4 * 32 + 2 * 2 * 32, device=device)
    fused[:, :128] = batch.query.reshape(tokens, 128)
    batch.query = fused[:, :128].view(tokens, 4, 32)
    assert not batch.query.is_contiguous()
    assert relative_error(run(batch), oracle(batch)) < FP32_TOLERANCE


def test_reference_agrees_with_oracle(device):
    """The oracle is a second reading of reference.paged_attention_ref's meaning."""
    batch = make_batch([(36, 1), (0, 23), (20, 9), (5, 1)], block_size=16, head_dim=32,
                       num_heads=4, num_kv_heads=2, dtype=torch.float32, device="cpu", seed=6)
    expected = kernels.paged_attention_ref(*batch.args())
    assert relative_error(expected, oracle(batch)) < FP32_TOLERANCE


# Sliding window and soft-capping: (seed, block size, sequences, window, softcap). Windows
# smaller than the contexts (blocks wholly before them point at NaN), equal to the longest
# context, and larger than every context; decodes, prompts and chunks after context.
WINDOWED_SEQS = [(40, 1), (0, 23), (20, 9), (0, 1), (31, 1), (3, 30), (70, 1)]
WINDOW_CASES = [
    pytest.param(0, 16, WINDOWED_SEQS, 8, None, id="window8-b16"),
    pytest.param(1, 16, WINDOWED_SEQS, 17, 5.0, id="window17-b16-softcap"),
    pytest.param(2, 4, WINDOWED_SEQS, 5, None, id="window5-b4"),
    pytest.param(3, 16, WINDOWED_SEQS, 71, None, id="window-equals-longest"),
    pytest.param(4, 16, WINDOWED_SEQS, 500, 2.0, id="window-larger-softcap"),
    pytest.param(5, 16, WINDOWED_SEQS, None, 3.0, id="softcap-only"),
    pytest.param(6, 16, [(0, 33), (5, 1)], 1, None, id="window1"),
    pytest.param(7, 4, [(0, 33), (50, 1), (21, 12)], 6, 1.5, id="window6-b4-softcap"),
]


@pytest.mark.parametrize("seed, block_size, seqs, window, softcap", WINDOW_CASES)
def test_reference_window_softcap(seed, block_size, seqs, window, softcap):
    batch = make_batch(seqs, block_size=block_size, head_dim=32, num_heads=4, num_kv_heads=2,
                       dtype=torch.float32, device="cpu", seed=seed, window=window)
    out = kernels.paged_attention_ref(*batch.args(), window=window, softcap=softcap)
    assert relative_error(out, oracle(batch, window, softcap)) < FP32_TOLERANCE, seqs


def test_window_and_softcap_change_the_result():
    """The options are not ignored: a window and a cap each give a different answer."""
    batch = make_batch(WINDOWED_SEQS, block_size=16, head_dim=32, num_heads=4, num_kv_heads=2,
                       dtype=torch.float32, device="cpu", seed=9)
    full = oracle(batch)
    assert relative_error(oracle(batch, 8), full) > 1e-2
    assert relative_error(oracle(batch, softcap=0.5), full) > 1e-2


@pytest.mark.parametrize("bad", [{"window": 0}, {"window": 2.5}, {"softcap": -1.0},
                                 {"window": True}])
def test_reference_refuses_bad_options(bad):
    batch = make_batch([(3, 1)], block_size=16, head_dim=32, num_heads=2, num_kv_heads=1,
                       dtype=torch.float32, device="cpu", seed=0)
    with pytest.raises(ValueError, match=next(iter(bad))):
        kernels.paged_attention_ref(*batch.args(), **bad)


# Triton with the same windowed batches: default launch, split-K over the window's tiles
# (tiles of 16 over cache blocks of 4 or 16: a first tile that straddles the window start).
@pytest.mark.parametrize("seed, block_size, seqs, window, softcap", WINDOW_CASES)
def test_triton_window_softcap(device, seed, block_size, seqs, window, softcap):
    # Odd seeds split; the interpreter is slow, so not every case runs both ways.
    config = AttentionConfig(num_splits=3, tile_size=16) if seed % 2 else None
    batch = make_batch(seqs, block_size=block_size, head_dim=32, num_heads=4, num_kv_heads=2,
                       dtype=torch.float32, device=device, seed=seed, window=window)
    out = torch.full_like(batch.query, float("nan"))
    paged_attention(*batch.args(), out=out, config=config, window=window, softcap=softcap)
    assert relative_error(out, oracle(batch, window, softcap)) < FP32_TOLERANCE, seqs


def test_triton_window_bfloat16(device):
    batch = make_batch(WINDOWED_SEQS, block_size=16, head_dim=64, num_heads=4, num_kv_heads=2,
                       dtype=torch.bfloat16, device=device, seed=12, window=12)
    out = paged_attention(*batch.args(), window=12, softcap=4.0,
                          config=AttentionConfig(num_splits=2, tile_size=16))
    assert relative_error(out, oracle(batch, 12, 4.0)) < LOW_PRECISION_TOLERANCE[torch.bfloat16]
