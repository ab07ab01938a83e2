"""fused_moe: the Triton kernel and the grouped torch path against a float64 per-token oracle."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from folio import kernels
from folio.executor.ops import TORCH_OPS, triton_ops
from folio.kernels.moe_reference import fused_moe_ref
from folio.kernels.triton_moe import MoEConfig, align_block_size, fused_moe

# Relative to the largest output: float32 differs from float64 only by summation order; bf16
# and fp16 round every intermediate like the expert modules do.
TOLERANCE = {torch.float32: 1e-5, torch.float16: 4e-3, torch.bfloat16: 3e-2}
ULP = {torch.float32: 2 ** -20, torch.float16: 2 ** -10, torch.bfloat16: 2 ** -7}


def oracle(hidden, w13, w2, topk_weights, topk_ids, activation="silu") -> torch.Tensor:
    """Token by token, expert by expert, in float64."""
    act_fn = F.silu if activation == "silu" else (lambda g: F.gelu(g, approximate="tanh"))
    inter = w13.shape[1] // 2
    out = torch.zeros(hidden.shape, dtype=torch.float64)
    for t in range(hidden.shape[0]):
        x = hidden[t].double()
        for j in range(topk_ids.shape[1]):
            e = int(topk_ids[t, j])
            gate_up = w13[e].double() @ x
            act = act_fn(gate_up[:inter]) * gate_up[inter:]
            out[t] += float(topk_weights[t, j]) * (w2[e].double() @ act)
    return out


def make_case(tokens, hidden, inter, experts, top_k, dtype, seed, ids=None):
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(tokens, hidden, generator=gen).to(dtype)
    w13 = (torch.randn(experts, 2 * inter, hidden, generator=gen) / hidden ** 0.5).to(dtype)
    w2 = (torch.randn(experts, hidden, inter, generator=gen) / inter ** 0.5).to(dtype)
    probs = torch.randn(tokens, experts, generator=gen).softmax(-1)
    weights, topk_ids = torch.topk(probs, top_k)
    if ids is not None:
        topk_ids = torch.tensor(ids, dtype=torch.int64).view(tokens, top_k)
    return x, w13, w2, weights, topk_ids


def assert_matches(actual, expected64, dtype):
    assert actual.dtype == dtype and actual.shape == expected64.shape
    scale = max(expected64.abs().max().item(), 1e-6)
    error = (actual.cpu().double() - expected64).abs().max().item()
    assert error <= TOLERANCE[dtype] * scale, f"max error {error:.3g} vs scale {scale:.3g}"


# (T, H, I, E, k): decode (T=1), experts left without a token, an expert with more pairs than
# one BLOCK_M (16) block, sizes that are not multiples of the tiles, k = 1 and k = E.
CASES = [
    (1, 32, 16, 8, 2),
    (3, 48, 40, 8, 2),
    (20, 32, 24, 3, 2),
    (5, 40, 32, 4, 1),
    (4, 32, 16, 2, 2),
]


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("case", CASES, ids=lambda c: "T{}-H{}-I{}-E{}-k{}".format(*c))
def test_triton_and_reference_match_oracle(device, case, dtype):
    args = make_case(*case, dtype, seed=sum(case))
    expected = oracle(*args)
    reference = fused_moe_ref(*args)
    assert_matches(reference, expected, dtype)
    actual = fused_moe(*(a.to(device) for a in args))
    assert_matches(actual, expected, dtype)
    # Both round every step the same way; a GPU's float32 sums run in another order, which
    # may move a rounding: two units in the last place apart at most (one of the largest).
    unit = ULP[dtype]
    torch.testing.assert_close(actual.cpu(), reference, rtol=2 * unit,
                               atol=unit * reference.abs().max().item())


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("case", [(1, 32, 16, 8, 2), (20, 32, 24, 3, 2)],
                         ids=lambda c: "T{}-H{}-I{}-E{}-k{}".format(*c))
def test_gelu_tanh_experts_match_oracle(device, case, dtype):
    """Gemma 4's experts gate with GELU's tanh form; silu's answer is far from it."""
    args = make_case(*case, dtype, seed=sum(case) + 7)
    expected = oracle(*args, activation="gelu_tanh")
    assert (oracle(*args) - expected).abs().max() > 2 * TOLERANCE[dtype] * expected.abs().max()
    assert_matches(fused_moe_ref(*args, activation="gelu_tanh"), expected, dtype)
    actual = fused_moe(*(a.to(device) for a in args), activation="gelu_tanh")
    assert_matches(actual, expected, dtype)
    with pytest.raises(ValueError, match="activation must be one of silu, gelu_tanh"):
        fused_moe_ref(*args, activation="relu")


def test_experts_without_tokens_and_int32_ids(device):
    # Every token routes to experts 1 and 5 of 8: six experts have no work at all.
    x, w13, w2, weights, ids = make_case(3, 32, 16, 8, 2, torch.float32, seed=7,
                                         ids=[1, 5, 5, 1, 1, 5])
    expected = oracle(x, w13, w2, weights, ids)
    ids32 = ids.to(torch.int32)
    assert_matches(fused_moe(x.to(device), w13.to(device), w2.to(device), weights.to(device),
                             ids32.to(device)), expected, torch.float32)
    assert_matches(fused_moe_ref(x, w13, w2, weights, ids32), expected, torch.float32)


def test_strided_views_and_explicit_config(device):
    # hidden as a column slice of a wider buffer, w13 as every other expert of a bigger stack.
    x, w13, w2, weights, ids = make_case(6, 32, 32, 6, 2, torch.float32, seed=3)
    wide = torch.randn(6, 80)
    wide[:, 8:40] = x
    stack = torch.randn(12, 64, 32)
    stack[::2] = w13
    expected = oracle(x, w13, w2, weights, ids)
    view_x, view_w13 = wide[:, 8:40].to(device), stack.to(device)[::2]
    assert not view_x.is_contiguous() and not view_w13.is_contiguous()
    out = fused_moe(view_x, view_w13, w2.to(device), weights.to(device), ids.to(device),
                    config=MoEConfig(block_m=32, block_n=16, block_k=16))
    assert_matches(out, expected, torch.float32)


def test_reference_fp16_and_no_tokens():
    args = make_case(4, 32, 16, 4, 2, torch.float16, seed=11)
    assert_matches(fused_moe_ref(*args), oracle(*args), torch.float16)
    empty = make_case(0, 32, 16, 4, 2, torch.bfloat16, seed=1)
    assert fused_moe_ref(*empty).shape == (0, 32)


def test_triton_no_tokens(device):
    x, w13, w2, weights, ids = make_case(0, 32, 16, 4, 2, torch.float32, seed=1)
    out = fused_moe(x.to(device), w13.to(device), w2.to(device), weights.to(device),
                    ids.to(device))
    assert out.shape == (0, 32) and out.dtype == torch.float32


def test_align_block_size_groups_pairs_by_expert():
    ids = torch.tensor([[2, 0], [2, 1], [0, 2], [2, 0]])          # 8 pairs, expert 3 unused
    sorted_pairs, block_expert, total = align_block_size(ids, num_experts=4, block_m=4)
    # expert 0: pairs 1, 4, 7; expert 1: pair 3; expert 2: pairs 0, 2, 5, 6 -> 3 blocks of 4.
    assert int(total) == 12
    assert sorted_pairs[:12].tolist() == [1, 4, 7, 8, 3, 8, 8, 8, 0, 2, 5, 6]
    assert (sorted_pairs[12:] == 8).all()
    assert block_expert[:3].tolist() == [0, 1, 2]


@pytest.mark.parametrize("override, error, name", [
    ({"hidden": torch.randn(3, 32, dtype=torch.float64)}, TypeError, "hidden"),
    ({"hidden": torch.randn(3, 33)}, ValueError, "w13"),
    ({"w13": torch.randn(4, 32, 32).half()}, TypeError, "w13"),
    ({"w13": torch.randn(4, 31, 32)}, ValueError, "w13"),
    ({"w2": torch.randn(4, 32, 8)}, ValueError, "w2"),
    ({"w2": torch.randn(4, 16, 32).transpose(1, 2)}, ValueError, "w2"),
    ({"topk_ids": torch.zeros(3, 2)}, TypeError, "topk_ids"),
    ({"topk_ids": torch.zeros(3, 5, dtype=torch.int64)}, ValueError, "topk_ids"),
    ({"topk_weights": torch.ones(2, 2)}, ValueError, "topk_weights"),
    ({"config": MoEConfig(block_m=24)}, ValueError, "block_m"),
])
def test_launcher_refuses_bad_arguments(device, override, error, name):
    args = dict(hidden=torch.randn(3, 32), w13=torch.randn(4, 32, 32), w2=torch.randn(4, 32, 16),
                topk_weights=torch.ones(3, 2), topk_ids=torch.zeros(3, 2, dtype=torch.int64))
    args.update(override)
    args = {k: v.to(device) if isinstance(v, torch.Tensor) else v for k, v in args.items()}
    with pytest.raises(error, match=name):
        fused_moe(**args)


def test_reference_refuses_out_of_range_ids():
    x, w13, w2, weights, _ = make_case(2, 32, 16, 4, 1, torch.float32, seed=2)
    with pytest.raises(ValueError, match="topk_ids"):
        fused_moe_ref(x, w13, w2, weights, torch.tensor([[1], [4]]))
    with pytest.raises(ValueError, match="topk_ids"):              # the one-token path
        fused_moe_ref(x[:1], w13, w2, weights[:1], torch.tensor([[-1]]))


def test_torch_and_triton_backends_have_fused_moe():
    # (the cpu backend's is kernels.moe_cpu's, tested in test_fused_moe_cpu.py)
    assert TORCH_OPS.fused_moe is fused_moe_ref
    assert triton_ops().fused_moe is kernels.fused_moe is fused_moe
