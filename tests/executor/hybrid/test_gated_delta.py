"""The gated delta rule's chunked form (prompts) and recurrent step (decode) against a
float64 token-by-token reference written from the rule itself, and the causal convolution's
state carried across calls."""

from __future__ import annotations

import torch

from folio.executor.models.hybrid import gated_delta
from folio.executor.models.hybrid.short_conv import causal_conv


def _reference(q, k, v, g, beta, state):
    """S <- exp(g) S; S <- S + k (beta (v - k^T S))^T; o = q^T S, in float64."""
    q, k, v, g, beta, state = (x.double() for x in (q, k, v, g, beta, state))
    out = []
    for t in range(q.shape[0]):
        state = state * g[t].exp()[:, None, None]
        read = torch.einsum("hk,hkv->hv", k[t], state)
        write = (v[t] - read) * beta[t][:, None]
        state = state + torch.einsum("hk,hv->hkv", k[t], write)
        out.append(torch.einsum("hk,hkv->hv", q[t], state))
    return torch.stack(out), state


def _inputs(length, heads=3, k_dim=8, v_dim=5, seed=0):
    gen = torch.Generator().manual_seed(seed)
    q, k = gated_delta.prepare_qk(torch.randn(length, heads, k_dim, generator=gen),
                                  torch.randn(length, heads, k_dim, generator=gen))
    v = torch.randn(length, heads, v_dim, generator=gen)
    g = -torch.rand(length, heads, generator=gen) * 2   # decays in log space, <= 0
    beta = torch.rand(length, heads, generator=gen)
    state = torch.randn(heads, k_dim, v_dim, generator=gen)
    return q, k, v, g, beta, state


def test_chunked_and_recurrent_match_the_rule():
    # 70 tokens in chunks of 16: four full chunks and a padded one, from a non-zero state.
    q, k, v, g, beta, state = _inputs(70)
    want_out, want_state = _reference(q, k, v, g, beta, state)
    for out, final in (gated_delta.chunked(q, k, v, g, beta, state, chunk=16),
                       gated_delta.recurrent(q, k, v, g, beta, state)):
        torch.testing.assert_close(out.double(), want_out, atol=1e-4, rtol=1e-4)
        torch.testing.assert_close(final.double(), want_state, atol=1e-4, rtol=1e-4)


def test_a_prompt_split_anywhere_continues_from_its_state():
    q, k, v, g, beta, state = _inputs(40, seed=1)
    whole, whole_state = gated_delta.chunked(q, k, v, g, beta, state, chunk=16)
    first, mid = gated_delta.chunked(q[:23], k[:23], v[:23], g[:23], beta[:23], state, chunk=16)
    rest, end = gated_delta.chunked(q[23:], k[23:], v[23:], g[23:], beta[23:], mid, chunk=16)
    torch.testing.assert_close(torch.cat((first, rest)), whole, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(end, whole_state, atol=1e-5, rtol=1e-5)


def test_causal_conv_state_carries_the_window():
    gen = torch.Generator().manual_seed(2)
    x = torch.randn(2, 6, 9, generator=gen)
    weight = torch.randn(6, 1, 4, generator=gen)
    bias = torch.randn(6, generator=gen)
    zeros = torch.zeros(2, 6, 3)
    whole, _ = causal_conv(x, zeros, weight, bias)
    padded = torch.nn.functional.conv1d(x, weight, bias, padding=3, groups=6)[..., :9]
    torch.testing.assert_close(whole, padded)
    first, window = causal_conv(x[..., :2], zeros, weight, bias)   # shorter than the window
    outs = [first]
    for t in range(2, 9):   # then one token at a time, as decode steps
        out, window = causal_conv(x[..., t:t + 1], window, weight, bias)
        outs.append(out)
    torch.testing.assert_close(torch.cat(outs, dim=-1), whole)
