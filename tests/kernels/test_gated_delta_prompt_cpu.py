"""The C++ delta rule over a prompt (kernels/cpu/gated_delta_chunk.cpp) against a float64
token-by-token reference and the torch chunked form: odd lengths, head counts and widths
(stripes of vectors, a lone vector, single columns), float32 and bfloat16 values, from a
fresh state (a stale NaN slot is never read) or a carried one; the request's slot updated
in place and every other slot untouched; a prompt split anywhere continues from its state
and leaves what decoding its tokens one at a time would (bit for bit on whole vectors of
columns); bad input refused by name."""

from __future__ import annotations

import pytest
import torch

from folio.executor.models.hybrid import gated_delta
from folio.kernels.cpu_recurrent import gated_delta_prompt_cpu, gated_delta_step_cpu

pytestmark = pytest.mark.usefixtures("cpu_ops_built")


def reference(q, k, v, g, beta, state):
    """S <- e^g S; S += k (beta (v - k^T S))^T; o = q^T S, token by token in float64."""
    q, k, v, g, beta, state = (t.double() for t in (q, k, v, g, beta, state))
    out = torch.empty(v.shape, dtype=torch.float64)
    for t in range(q.shape[0]):
        state = state * g[t].exp()[:, None, None]
        delta = (v[t] - torch.einsum("hk,hkv->hv", k[t], state)) * beta[t][:, None]
        state = state + k[t][:, :, None] * delta[:, None, :]
        out[t] = torch.einsum("hk,hkv->hv", q[t], state)
    return out, state


def inputs(length, heads, k_dim, v_dim, dtype, seed):
    gen = torch.Generator().manual_seed(seed)
    q, k = gated_delta.prepare_qk(torch.randn(length, heads, k_dim, generator=gen),
                                  torch.randn(length, heads, k_dim, generator=gen))
    v = torch.randn(length, heads, v_dim, generator=gen).to(dtype)
    g = -torch.rand(length, heads, generator=gen) * 2          # log decay <= 0
    beta = torch.rand(length, heads, generator=gen)
    return q, k, v, g, beta


SHAPES = [(2, 12, 20), (4, 32, 48), (3, 128, 128), (1, 16, 5)]


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("heads,k_dim,v_dim", SHAPES)
@pytest.mark.parametrize("length", [1, 7, 64, 65, 200])
@pytest.mark.parametrize("fresh", [True, False])
def test_prompt_matches_the_rule_in_its_slot(length, heads, k_dim, v_dim, dtype, fresh):
    slot, num_slots = 2, 4
    gen = torch.Generator().manual_seed(length + heads)
    pool = torch.randn(num_slots, heads, k_dim, v_dim, generator=gen) * 0.5
    if fresh:
        pool[slot] = float("nan")     # a fresh request's stale slot is never read
    before = pool.clone()
    q, k, v, g, beta = inputs(length, heads, k_dim, v_dim, dtype, seed=length)
    start = torch.zeros_like(pool[slot]) if fresh else before[slot]
    want_out, want_state = reference(q, k, v, g, beta, start)
    got = gated_delta_prompt_cpu(q, k, v, g, beta, pool, slot, fresh)
    assert got.dtype == torch.float32 and got.shape == (length, heads, v_dim)
    torch.testing.assert_close(got.double(), want_out, rtol=1e-4, atol=1e-4)
    torch.testing.assert_close(pool[slot].double(), want_state, rtol=1e-4, atol=1e-4)
    others = [s for s in range(num_slots) if s != slot]
    assert torch.equal(pool[others], before[others])
    # The torch chunked form (the path without the C++ library) within float32 rounding.
    chunk_out, chunk_state = gated_delta.chunked(q, k, v, g, beta, start)
    torch.testing.assert_close(got, chunk_out, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(pool[slot], chunk_state, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("v_dim", [48, 40])
def test_a_prompt_is_its_decode_steps(dtype, v_dim):
    """The sums run in the decode step's order: a prompt (split anywhere, as at a
    checkpoint) leaves the outputs and state of decoding its tokens one at a time, bit for
    bit on whole vectors of columns (48: AVX-512's stripe and lone vector), within float32
    rounding on the columns past them (40: 8 single columns, which the compiler contracts
    differently in the two kernels)."""
    heads, k_dim, length = 3, 32, 23
    q, k, v, g, beta = inputs(length, heads, k_dim, v_dim, dtype, seed=3)
    prompt_pool = torch.full((2, heads, k_dim, v_dim), float("nan"))
    first = gated_delta_prompt_cpu(q[:9], k[:9], v[:9], g[:9], beta[:9], prompt_pool, 1, True)
    rest = gated_delta_prompt_cpu(q[9:], k[9:], v[9:], g[9:], beta[9:], prompt_pool, 1, False)
    decode_pool = torch.full((2, heads, k_dim, v_dim), float("nan"))
    slot = torch.tensor([1])
    steps = [gated_delta_step_cpu(q[t:t + 1], k[t:t + 1], v[t:t + 1], g[t:t + 1],
                                  beta[t:t + 1], decode_pool, slot, [t == 0])
             for t in range(length)]
    if v_dim == 48:
        assert torch.equal(torch.cat((first, rest)), torch.cat(steps))
        assert torch.equal(prompt_pool[1], decode_pool[1])
    torch.testing.assert_close(torch.cat((first, rest)), torch.cat(steps), rtol=1e-6,
                               atol=1e-7)
    torch.testing.assert_close(prompt_pool[1], decode_pool[1], rtol=1e-6, atol=1e-7)


def test_strided_views_as_the_model_hands_them():
    """v a view of one projection's output (its token stride the projection's width)."""
    length, heads, k_dim, v_dim = 9, 2, 16, 24
    q, k, v, g, beta = inputs(length, heads, k_dim, v_dim, torch.float32, seed=5)
    joined = torch.cat((v.reshape(length, -1), torch.randn(length, 7)), dim=-1)
    v_view = joined[:, :heads * v_dim].reshape(length, heads, v_dim)
    assert not v_view.is_contiguous()
    pool = torch.randn(3, heads, k_dim, v_dim)
    pool_copy = pool.clone()
    got = gated_delta_prompt_cpu(q, k, v_view, g, beta, pool, 1, False)
    want = gated_delta_prompt_cpu(q, k, v.contiguous(), g, beta, pool_copy, 1, False)
    assert torch.equal(got, want) and torch.equal(pool, pool_copy)


def test_an_empty_prompt_writes_nothing():
    pool = torch.full((2, 2, 8, 8), float("nan"))
    q, k, v, g, beta = inputs(0, 2, 8, 8, torch.float32, seed=0)
    out = gated_delta_prompt_cpu(q, k, v, g, beta, pool, 0, True)
    assert out.shape == (0, 2, 8) and pool.isnan().all()


@pytest.mark.parametrize("change,message", [
    (lambda a: a.update(slot=3), "slot 3 outside the pool of 3 slots"),
    (lambda a: a.update(slot=-1), "slot -1 outside the pool"),
    (lambda a: a.update(q=a["q"].double()), "q and k must be float32"),
    (lambda a: a.update(k=a["k"][:4]), "k must be [5, 2, 8]"),
    (lambda a: a.update(g=a["g"][:, :1]), "g must be [5, 2]"),
    (lambda a: a.update(beta=a["beta"].double()), "beta must be a float32"),
    (lambda a: a.update(pool=a["pool"].double()), "pool must be a float32"),
    (lambda a: a.update(pool=a["pool"][:, :, :4]), "pool must be contiguous"),
    (lambda a: a.update(pool=a["pool"][:, :, :4].contiguous()), "pool must be [slots, 2, 8, 8]"),
    (lambda a: a.update(v=a["v"].half()), "v must be float32 or bfloat16"),
    (lambda a: a.update(v=torch.randn(5, 2, 16)[..., ::2]), "v must be contiguous in its last"),
])
def test_bad_input_is_refused_by_name(change, message):
    q, k, v, g, beta = inputs(5, 2, 8, 8, torch.float32, seed=0)
    args = dict(q=q, k=k, v=v, g=g, beta=beta, pool=torch.zeros(3, 2, 8, 8), slot=1,
                fresh=False)
    change(args)
    with pytest.raises(RuntimeError, match=message.replace("[", r"\[").replace("]", r"\]")):
        gated_delta_prompt_cpu(**args)
