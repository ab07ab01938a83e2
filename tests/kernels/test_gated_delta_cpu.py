"""The C++ delta-rule decode step (kernels/cpu/gated_delta.cpp) against a float64 reference:
a batch of requests whose states live in scattered pool slots, some fresh, read and written
in place, the other slots untouched; float32 and bfloat16 values; several steps in a row;
bad input refused naming the field."""

from __future__ import annotations

import pytest
import torch

from folio.executor.models.hybrid.gated_delta import prepare_qk
from folio.kernels.cpu_recurrent import gated_delta_step_cpu

pytestmark = pytest.mark.usefixtures("cpu_ops_built")


def reference_step(q, k, v, g, beta, state):
    """One token per request in float64: S <- e^g S; S += k (beta (v - k^T S))^T; o = q^T S."""
    q, k, v, g, beta, state = (t.double() for t in (q, k, v, g, beta, state))
    state = state * g.exp()[..., None, None]
    delta = (v - torch.einsum("bhk,bhkv->bhv", k, state)) * beta[..., None]
    state = state + k[..., :, None] * delta[..., None, :]
    return torch.einsum("bhk,bhkv->bhv", q, state), state


def inputs(batch, heads, k_dim, v_dim, dtype, seed):
    gen = torch.Generator().manual_seed(seed)
    q, k = prepare_qk(torch.randn(batch, heads, k_dim, generator=gen),
                      torch.randn(batch, heads, k_dim, generator=gen))
    v = torch.randn(batch, heads, v_dim, generator=gen).to(dtype)
    g = -torch.rand(batch, heads, generator=gen) * 2          # log decay <= 0
    beta = torch.rand(batch, heads, generator=gen)
    return q, k, v, g, beta


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("heads,k_dim,v_dim", [(2, 12, 20), (4, 32, 48), (3, 128, 128)])
def test_step_updates_pool_slots_in_place(dtype, heads, k_dim, v_dim):
    batch, num_slots = 5, 9
    slots = torch.tensor([7, 0, 4, 2, 8])
    fresh = [False, True, False, False, True]
    gen = torch.Generator().manual_seed(heads)
    pool = torch.randn(num_slots, heads, k_dim, v_dim, generator=gen)
    pool[8] = float("nan")          # a fresh request's stale slot is never read
    before = pool.clone()
    state = before[slots].clone()
    state[torch.tensor(fresh)] = 0.0
    expected_pool = before.double()
    for step in range(3):           # the state carries from step to step in its slot
        q, k, v, g, beta = inputs(batch, heads, k_dim, v_dim, dtype, seed=step)
        want, state = reference_step(q, k, v, g, beta, state)
        got = gated_delta_step_cpu(q, k, v, g, beta, pool, slots,
                                   fresh if step == 0 else [False] * batch)
        assert got.dtype == torch.float32 and got.shape == (batch, heads, v_dim)
        torch.testing.assert_close(got.double(), want, rtol=1e-4, atol=1e-4)
    expected_pool[slots] = state
    torch.testing.assert_close(pool.double(), expected_pool, rtol=1e-4, atol=1e-4)
    untouched = [s for s in range(num_slots) if s not in slots.tolist()]
    assert torch.equal(pool[untouched], before[untouched])


def test_strided_views_as_the_model_hands_them():
    """q/k/v views of one projection's output (first two strides free) give the same."""
    batch, heads, k_dim, v_dim = 3, 2, 16, 24
    q, k, v, g, beta = inputs(batch, heads, k_dim, v_dim, torch.float32, seed=5)
    joined = torch.cat((v.reshape(batch, -1), torch.randn(batch, 7)), dim=-1)
    v_view = joined[:, :heads * v_dim].reshape(batch, heads, v_dim)
    assert not v_view.is_contiguous()
    pool = torch.randn(4, heads, k_dim, v_dim)
    pool_copy = pool.clone()
    slots = torch.tensor([3, 1, 0])
    got = gated_delta_step_cpu(q, k, v_view, g, beta, pool, slots, [False] * batch)
    want = gated_delta_step_cpu(q, k, v.contiguous(), g, beta, pool_copy, slots, [False] * batch)
    assert torch.equal(got, want) and torch.equal(pool, pool_copy)


def test_empty_batch_is_a_no_op():
    pool = torch.randn(2, 2, 8, 8)
    before = pool.clone()
    q, k, v, g, beta = inputs(0, 2, 8, 8, torch.float32, seed=0)
    out = gated_delta_step_cpu(q, k, v, g, beta, pool, torch.zeros(0, dtype=torch.int64), [])
    assert out.shape == (0, 2, 8) and torch.equal(pool, before)


@pytest.mark.parametrize("change,message", [
    (lambda a: a.update(slots=torch.tensor([0, 9])), "slot 9 outside the pool"),
    (lambda a: a.update(slots=torch.tensor([1, 1])), "slot 1 appears twice"),
    (lambda a: a.update(fresh=[True]), "fresh must have 2 entries"),
    (lambda a: a.update(q=a["q"].double()), "q and k must be float32"),
    (lambda a: a.update(g=a["g"][:, :1]), "g must be [2, 2]"),
    (lambda a: a.update(pool=a["pool"].double()), "pool must be a float32"),
    (lambda a: a.update(pool=a["pool"][:, :, :4]), "pool must be contiguous"),
    (lambda a: a.update(pool=a["pool"][:, :, :4].contiguous()), "pool must be [slots, 2, 8, 8]"),
    (lambda a: a.update(v=a["v"].half()), "v must be float32 or bfloat16"),
])
def test_bad_input_is_refused_by_name(change, message):
    q, k, v, g, beta = inputs(2, 2, 8, 8, torch.float32, seed=0)
    args = dict(q=q, k=k, v=v, g=g, beta=beta, pool=torch.zeros(3, 2, 8, 8),
                slots=torch.tensor([0, 2]), fresh=[False, False])
    change(args)
    with pytest.raises(RuntimeError, match=message.replace("[", r"\[").replace("]", r"\]")):
        gated_delta_step_cpu(**args)
