"""The Triton prompt kernel of the gated delta rule (kernels/triton_gated_delta.py
`delta_rule_prompt`) against a float64 token-by-token reference of the rule: one request's
L tokens on its slot of the state pool in place, fresh (the slot's old contents, NaN here,
never read) or from the slot's state, every other slot untouched; lengths around the
kernel's blocks and widths that are not powers of two (masked rows and column blocks);
under the interpreter where there is no GPU."""

from __future__ import annotations

import pytest
import torch

from folio.kernels.triton_gated_delta import delta_rule_prompt, delta_rule_step


def _reference(q, k, v, g, beta, state):
    q, k, v, g, beta, state = (x.double() for x in (q, k, v, g, beta, state))
    out = torch.empty(v.shape, dtype=torch.float64)
    for t in range(q.shape[0]):
        state = state * g[t].exp()[:, None, None]
        read = torch.einsum("hk,hkv->hv", k[t], state)
        state = state + torch.einsum("hk,hv->hkv", k[t], (v[t] - read) * beta[t][:, None])
        out[t] = torch.einsum("hk,hkv->hv", q[t], state)
    return out, state


def _inputs(length, heads, k_dim, v_dim, seed, v_dtype=torch.float32):
    gen = torch.Generator().manual_seed(seed)
    unit = lambda: torch.nn.functional.normalize(  # noqa: E731
        torch.randn(length, heads, k_dim, generator=gen), dim=-1)
    q, k = unit() * k_dim ** -0.5, unit()
    v = torch.randn(length, heads, v_dim, generator=gen).to(v_dtype)
    g = -torch.rand(length, heads, generator=gen)
    beta = torch.rand(length, heads, generator=gen)
    return q, k, v, g, beta


def _pool(heads, k_dim, v_dim, fresh_slot):
    gen = torch.Generator().manual_seed(9)
    pool = torch.randn(4, heads, k_dim, v_dim, generator=gen) * 0.3
    pool[fresh_slot] = float("nan")
    return pool


@pytest.mark.parametrize("length", [1, 7, 64, 65, 130])
@pytest.mark.parametrize("heads,k_dim,v_dim", [(1, 16, 8), (3, 12, 40)])
@pytest.mark.parametrize("fresh", [True, False])
def test_prompt_matches_the_rule_on_the_pool(device, length, heads, k_dim, v_dim, fresh):
    slot, fresh_slot = 2, 2 if fresh else 0
    q, k, v, g, beta = _inputs(length, heads, k_dim, v_dim, seed=length + heads)
    pool = _pool(heads, k_dim, v_dim, fresh_slot)
    start = torch.zeros_like(pool[slot]) if fresh else pool[slot]
    want_out, want_state = _reference(q, k, v, g, beta, start)
    on = [t.to(device) for t in (q, k, v, g, beta, pool)]
    out = delta_rule_prompt(*on, slot, fresh).cpu()
    after = on[5].cpu()
    torch.testing.assert_close(out.double(), want_out, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(after[slot].double(), want_state, atol=1e-5, rtol=1e-5)
    others = [s for s in range(4) if s != slot]
    assert torch.equal(after[others].isnan(), pool[others].isnan())
    assert torch.equal(torch.nan_to_num(after[others]), torch.nan_to_num(pool[others]))


def test_bfloat16_values_are_read_in_float32(device):
    q, k, v, g, beta = _inputs(9, 2, 16, 24, seed=5, v_dtype=torch.bfloat16)
    pool = _pool(2, 16, 24, fresh_slot=1)
    want_out, want_state = _reference(q, k, v.float(), g, beta, pool[3])
    on = [t.to(device) for t in (q, k, v, g, beta, pool)]
    out = delta_rule_prompt(*on, 3, False).cpu()
    torch.testing.assert_close(out.double(), want_out, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(on[5].cpu()[3].double(), want_state, atol=1e-5, rtol=1e-5)


def test_a_prompt_computes_what_decoding_it_would(device):
    """The prompt kernel runs the decode step's sums: the same outputs and state as
    delta_rule_step token after token."""
    q, k, v, g, beta = _inputs(6, 2, 12, 40, seed=11)
    pool = _pool(2, 12, 40, fresh_slot=0)
    prompt_pool, step_pool = pool.clone().to(device), pool.clone().to(device)
    on = [t.to(device) for t in (q, k, v, g, beta)]
    out = delta_rule_prompt(*on, prompt_pool, 1, False)
    slots = torch.tensor([1], device=device)
    fresh = torch.tensor([0], dtype=torch.int32, device=device)
    steps = torch.cat([delta_rule_step(*(x[t:t + 1] for x in on), step_pool, slots, fresh)
                       for t in range(6)])
    torch.testing.assert_close(out, steps, atol=1e-6, rtol=1e-6)
    torch.testing.assert_close(prompt_pool, step_pool, atol=1e-6, rtol=1e-6, equal_nan=True)


def test_bad_arguments_are_refused_by_name(device):
    q, k, v, g, beta = (t.to(device) for t in _inputs(3, 2, 8, 8, seed=1))
    pool = torch.zeros(2, 2, 8, 8, device=device)
    with pytest.raises(ValueError, match="slot 2 is outside the pool's 2 slots"):
        delta_rule_prompt(q, k, v, g, beta, pool, 2, False)
    with pytest.raises(ValueError, match="pool must be contiguous float32"):
        delta_rule_prompt(q, k, v, g, beta, pool.double(), 0, False)
    with pytest.raises(ValueError, match="v must be contiguous"):
        delta_rule_prompt(q, k, v.to(torch.int32), g, beta, pool, 0, False)
    with pytest.raises(ValueError, match="shapes disagree"):
        delta_rule_prompt(q, k, v, g[:2], beta, pool, 0, False)
