"""Attention sinks (gpt-oss: one learned logit per head in every row's softmax denominator)
in the torch reference, the C++ CPU operator and the Triton kernel (interpreted on CPU),
each against the float64 oracle; with windows, GQA, decodes, prompts and chunks."""

from __future__ import annotations

import pytest
import torch

from folio import kernels
from folio.kernels import AttentionConfig, cpu_attention, paged_attention
from tests.kernels.paged_batch import make_batch, oracle, relative_error

TOLERANCE = 1e-4
SEQS = [(40, 1), (0, 23), (20, 9), (0, 1), (3, 30), (70, 1)]
HEADS, KV_HEADS = 4, 2


def _batch(device, window, seed=3, head_dim=32, block_size=16):
    return make_batch(SEQS, block_size=block_size, head_dim=head_dim, num_heads=HEADS,
                      num_kv_heads=KV_HEADS, dtype=torch.float32, device=device, seed=seed,
                      window=window)


def _sinks(seed=0) -> torch.Tensor:
    # Large enough to take a real share of each row's mass (scores here are about +-3).
    return torch.randn(HEADS, generator=torch.Generator().manual_seed(seed)) * 2.0 + 1.0


def test_sinks_change_the_result():
    batch = _batch("cpu", None)
    assert relative_error(oracle(batch, sinks=_sinks()), oracle(batch)) > 1e-2


@pytest.mark.parametrize("window", [None, 8])
def test_reference(window):
    batch = _batch("cpu", window)
    out = kernels.paged_attention_ref(*batch.args(), window=window, sinks=_sinks())
    assert relative_error(out, oracle(batch, window, sinks=_sinks())) < TOLERANCE


@pytest.mark.parametrize("head_dim, window", [(64, None), (64, 8), (40, 5)])
def test_cpu_operator(head_dim, window):
    if not cpu_attention.load().ok:
        cpu_attention.build()
    batch = _batch("cpu", window, head_dim=head_dim, block_size=4 if head_dim == 40 else 16)
    out = torch.full_like(batch.query, float("nan"))
    cpu_attention.paged_attention_cpu(*batch.args(), out=out, window=window, sinks=_sinks())
    assert relative_error(out, oracle(batch, window, sinks=_sinks())) < TOLERANCE


def test_cpu_operator_refuses_a_wrong_sink_count():
    if not cpu_attention.load().ok:
        cpu_attention.build()
    batch = _batch("cpu", None)
    with pytest.raises(ValueError, match="sinks"):
        cpu_attention.paged_attention_cpu(*batch.args(), sinks=torch.zeros(HEADS + 1))


# Split-K: the sink must count once across the splits (the first split starts from it).
@pytest.mark.parametrize("window, config", [
    (None, None), (8, AttentionConfig(num_splits=3, tile_size=16))], ids=["one-split", "split3"])
def test_triton(device, window, config):
    batch = _batch(device, window)
    out = torch.full_like(batch.query, float("nan"))
    paged_attention(*batch.args(), out=out, config=config, window=window,
                    sinks=_sinks().to(device))
    assert relative_error(out, oracle(batch, window, sinks=_sinks())) < TOLERANCE
