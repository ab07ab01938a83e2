"""The cpu kernel set's fused_moe (kernels.moe_cpu): oneDNN on prepacked expert weights."""

from __future__ import annotations

import gc

import pytest
import torch

from folio.executor.ops import cpu_ops
from folio.kernels.moe_cpu import CpuFusedMoe, onednn_available
from folio.kernels.onednn_packing import onednn_packs
from tests.kernels.test_fused_moe import assert_matches, make_case, oracle

needs_onednn = pytest.mark.skipif(not onednn_available(), reason="torch without oneDNN")


@needs_onednn
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("case", [(2, 64, 48, 8, 2), (40, 64, 32, 4, 2), (6, 48, 40, 6, 6)],
                         ids=lambda c: "T{}-H{}-I{}-E{}-k{}".format(*c))
def test_packed_path_matches_oracle(case, dtype):
    """bfloat16 packs where oneDNN can (AVX-512 or AVX-NE-CONVERT); elsewhere the same call
    takes the grouped path and must still match."""
    args = make_case(*case, dtype, seed=sum(case) + 1)
    moe = CpuFusedMoe(min_pack_elements=0)
    packs = onednn_packs(dtype)
    assert moe.uses_onednn(args[1], case[0]) == packs
    assert_matches(moe(*args), oracle(*args), dtype)
    assert moe.num_packed == int(packs)


@needs_onednn
def test_packed_path_gates_with_gelu_tanh():
    args = make_case(24, 64, 48, 6, 2, torch.float32, seed=3)
    moe = CpuFusedMoe(min_pack_elements=0)
    assert moe.uses_onednn(args[1], 24)
    assert_matches(moe(*args, activation="gelu_tanh"), oracle(*args, activation="gelu_tanh"),
                   torch.float32)


def test_small_experts_single_tokens_and_fp16_take_the_grouped_path():
    moe = CpuFusedMoe()                       # default threshold: these weights are tiny
    for dtype in (torch.float32, torch.float16):
        args = make_case(5, 32, 16, 4, 2, dtype, seed=5)
        assert not moe.uses_onednn(args[1], 5)
        assert_matches(moe(*args), oracle(*args), dtype)
    one_token = make_case(1, 64, 48, 8, 2, torch.float32, seed=6)
    assert not CpuFusedMoe(min_pack_elements=0).uses_onednn(one_token[1], 1)
    assert_matches(moe(*one_token), oracle(*one_token), torch.float32)
    assert moe.num_packed == 0
    with pytest.raises(TypeError, match="w13"):
        moe(args[0], "w13", args[2], args[3], args[4])
    empty = make_case(0, 32, 16, 4, 2, torch.float32, seed=5)
    assert moe(*empty).shape == (0, 32)


@needs_onednn
def test_packs_once_repacks_changed_weights_and_forgets_freed_ones():
    moe = CpuFusedMoe(min_pack_elements=0)
    x, w13, w2, weights, ids = make_case(7, 32, 32, 4, 2, torch.float32, seed=9)
    assert_matches(moe(x, w13, w2, weights, ids), oracle(x, w13, w2, weights, ids),
                   torch.float32)
    first = moe._packed[id(w13)]
    moe(x, w13, w2, weights, ids)
    assert moe._packed[id(w13)] is first                  # reused, not packed again
    with torch.no_grad():
        w2.mul_(-2.0)                                     # e.g. weights loaded after a call
    assert_matches(moe(x, w13, w2, weights, ids), oracle(x, w13, w2, weights, ids),
                   torch.float32)
    assert moe._packed[id(w13)] is not first and moe.num_packed == 1
    del w13, first
    gc.collect()
    assert moe.num_packed == 0


def test_cpu_kernel_set_uses_it(cpu_ops_built):
    assert isinstance(cpu_ops().fused_moe, CpuFusedMoe)
    moe = cpu_ops().fused_moe
    args = make_case(3, 32, 16, 4, 2, torch.bfloat16, seed=4)
    assert_matches(moe(*args), oracle(*args), torch.bfloat16)


@needs_onednn
def test_weights_made_in_inference_mode():
    moe = CpuFusedMoe(min_pack_elements=0)
    with torch.inference_mode():
        args = make_case(4, 32, 32, 4, 2, torch.float32, seed=12)
        out = moe(*args)
    assert_matches(out, oracle(*args), torch.float32)
    assert moe.num_packed == 1
