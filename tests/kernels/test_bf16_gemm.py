"""Folio's AVX-512 BF16 kernel (kernels/cpu/bf16_gemm.cpp) through the layer that repacks for
it (TiledBf16Linear): against a float64 sum of the same bfloat16 values, over odd sizes and
batch sizes, with and without a bias; a row's result does not depend on its batch; an odd K
stays on oneDNN."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from folio.executor.linear import (PackedLinear, TiledBf16Linear, pack_linears,
                                   tiled_bf16_unavailable_reason)

CPU = torch.device("cpu")
pytestmark = [pytest.mark.usefixtures("cpu_ops_built"),
              pytest.mark.skipif(tiled_bf16_unavailable_reason(CPU, torch.bfloat16) is not None,
                                 reason="needs the CPU operators built for a CPU with AVX-512 "
                                        "BF16 (elsewhere oneDNN runs bfloat16)")]


@pytest.mark.parametrize("n,k,bias", [(16, 32, True), (37, 96, False), (200, 576, True),
                                      (70, 1538, False)])
def test_matches_a_float64_sum_at_every_batch_size(n, k, bias):
    torch.manual_seed(n)
    linear = nn.Linear(k, n, bias=bias).bfloat16()
    layer = TiledBf16Linear(linear)
    x = torch.randn(9, k).bfloat16()
    exact = x.double() @ linear.weight.detach().double().T
    if bias:
        exact += linear.bias.detach().double()
    for m in (1, 2, 3, 4, 5, 9):
        got = layer(x[:m]).detach().double()
        # float32 sums of exact bfloat16 products, rounded once to bfloat16 at the end
        torch.testing.assert_close(got, exact[:m], rtol=1e-2, atol=1e-2 * float(exact.abs().max()))
        assert got.shape == (m, n)


def test_a_row_is_the_same_alone_and_in_any_batch():
    torch.manual_seed(0)
    layer = TiledBf16Linear(nn.Linear(576, 960).bfloat16())
    x = torch.randn(67, 576).bfloat16()
    batch = layer(x)
    for m in (1, 2, 3, 5, 16, 67):
        assert torch.equal(layer(x[:m]), batch[:m])
    assert torch.equal(layer(x[40:41]), batch[40:41])
    assert layer(x.view(1, 67, 576)).shape == (1, 67, 960)


def test_pack_linears_takes_it_for_bfloat16_and_leaves_odd_k_to_onednn():
    model = nn.Sequential(nn.Linear(64, 48), nn.Linear(48, 33), nn.Linear(33, 8)).bfloat16()
    x = torch.randn(3, 64).bfloat16()
    reference = model(x)
    assert pack_linears(model, CPU, torch.bfloat16) == "bf16-tiles"
    assert [type(m) for m in model] == [TiledBf16Linear, TiledBf16Linear, PackedLinear]
    with torch.no_grad():
        torch.testing.assert_close(model(x), reference, rtol=3e-2, atol=3e-2)
    asked = nn.Sequential(nn.Linear(64, 48)).bfloat16()
    assert pack_linears(asked, CPU, torch.bfloat16, "onednn") == "onednn"
    assert type(asked[0]) is PackedLinear
