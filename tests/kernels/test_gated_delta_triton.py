"""The Triton decode step of the gated delta rule (kernels/triton_gated_delta.py) against a
float64 reference of the rule, on a state pool updated in place at the requests' slots,
fresh requests starting from zeros; under the interpreter where there is no GPU."""

from __future__ import annotations

import torch

from folio.kernels.triton_gated_delta import delta_rule_step


def _reference(q, k, v, g, beta, state):
    q, k, v, g, beta, state = (x.double() for x in (q, k, v, g, beta, state))
    state = state * g.exp()[..., None, None]
    read = torch.einsum("bhk,bhkv->bhv", k, state)
    state = state + torch.einsum("bhk,bhv->bhkv", k, (v - read) * beta[..., None])
    return torch.einsum("bhk,bhkv->bhv", q, state), state


def test_step_matches_the_rule_on_the_pool(device):
    gen = torch.Generator().manual_seed(3)
    batch, heads, k_dim, v_dim, slots = 3, 2, 12, 5, 6   # dims not powers of two: masks
    pool = torch.randn(slots, heads, k_dim, v_dim, generator=gen)
    q = torch.nn.functional.normalize(torch.randn(batch, heads, k_dim, generator=gen), dim=-1)
    q = q * k_dim ** -0.5
    k = torch.nn.functional.normalize(torch.randn(batch, heads, k_dim, generator=gen), dim=-1)
    v = torch.randn(batch, heads, v_dim, generator=gen)
    g = -torch.rand(batch, heads, generator=gen)
    beta = torch.rand(batch, heads, generator=gen)
    where = torch.tensor([4, 0, 2])
    fresh = torch.tensor([0, 1, 0])
    start = pool[where].clone()
    start[1] = 0   # the fresh request's state is zeros, whatever its slot held
    want_out, want_state = _reference(q, k, v, g, beta, start)
    on = [t.to(device) for t in (q, k, v, g, beta, pool, where, fresh)]
    out = delta_rule_step(*on)
    torch.testing.assert_close(out.cpu().double(), want_out, atol=1e-5, rtol=1e-5)
    after = on[5].cpu()
    torch.testing.assert_close(after[where].double(), want_state, atol=1e-5, rtol=1e-5)
    untouched = [s for s in range(slots) if s not in where.tolist()]
    assert torch.equal(after[untouched], pool[untouched])
