"""The gated delta rule's decode step (Gated DeltaNet, executor/models/hybrid/), on the
state pool in place: one program per (request, value head) loads that head's float32
[k_dim, v_dim] state from the request's slot (zeros for a fresh request), applies one token
    S <- exp(g) S;   S <- S + k (beta (v - k^T S))^T;   o = q^T S
and writes S back and o out. Meaning: executor/models/hybrid/gated_delta.py `recurrent`
(q already l2-normed and scaled, k l2-normed, all float32)."""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from folio.kernels._launch import check_launch_device, next_power_of_2, on_device


@triton.jit
def _delta_step_kernel(
    q_ptr, k_ptr, v_ptr, g_ptr, beta_ptr, pool_ptr, slots_ptr, fresh_ptr, out_ptr,
    heads, k_dim, v_dim,
    BLOCK_K: tl.constexpr, BLOCK_V: tl.constexpr,
):
    row = tl.program_id(0).to(tl.int64)    # request
    head = tl.program_id(1).to(tl.int64)
    ks = tl.arange(0, BLOCK_K)
    vs = tl.arange(0, BLOCK_V)
    k_mask = ks < k_dim
    v_mask = vs < v_dim
    vec = (row * heads + head)
    q = tl.load(q_ptr + vec * k_dim + ks, mask=k_mask, other=0.0)
    k = tl.load(k_ptr + vec * k_dim + ks, mask=k_mask, other=0.0)
    v = tl.load(v_ptr + vec * v_dim + vs, mask=v_mask, other=0.0)
    g = tl.load(g_ptr + vec)
    beta = tl.load(beta_ptr + vec)
    slot = tl.load(slots_ptr + row).to(tl.int64)
    fresh = tl.load(fresh_ptr + row)
    base = (slot * heads + head) * k_dim * v_dim
    offsets = ks[:, None] * v_dim + vs[None, :]
    mask = k_mask[:, None] & v_mask[None, :]
    state = tl.load(pool_ptr + base + offsets, mask=mask, other=0.0)
    state = tl.where(fresh != 0, 0.0, state)
    state = state * tl.exp(g)
    remembered = tl.sum(state * k[:, None], axis=0)
    delta = (v - remembered) * beta
    state = state + k[:, None] * delta[None, :]
    out = tl.sum(state * q[:, None], axis=0)
    tl.store(pool_ptr + base + offsets, state, mask=mask)
    tl.store(out_ptr + vec * v_dim + vs, out, mask=v_mask)


def delta_rule_step(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, g: torch.Tensor,
                    beta: torch.Tensor, pool: torch.Tensor, slots: torch.Tensor,
                    fresh: torch.Tensor) -> torch.Tensor:
    """q, k [B, H, Dk], v [B, H, Dv], g, beta [B, H] (float32); pool [S, H, Dk, Dv]
    float32, updated in place at `slots` [B] (int64); fresh [B] (int32, nonzero: start from
    zeros). Returns the outputs [B, H, Dv] (float32)."""
    batch, heads, k_dim = q.shape
    v_dim = v.shape[-1]
    for name, tensor in (("q", q), ("k", k), ("v", v), ("g", g), ("beta", beta),
                         ("pool", pool)):
        if tensor.dtype != torch.float32 or not tensor.is_contiguous():
            raise ValueError(f"{name} must be contiguous float32")
    if k.shape != q.shape or v.shape[:2] != (batch, heads) or g.shape != (batch, heads) \
            or beta.shape != (batch, heads) or pool.shape[1:] != (heads, k_dim, v_dim) \
            or slots.shape != (batch,) or fresh.shape != (batch,):
        raise ValueError("delta_rule_step: shapes disagree")
    check_launch_device("pool", pool, _delta_step_kernel)
    out = torch.empty_like(v)
    if batch:
        with on_device(pool):
            _delta_step_kernel[(batch, heads)](
                q, k, v, g, beta, pool, slots.to(torch.int64).contiguous(),
                fresh.to(torch.int32).contiguous(), out, heads, k_dim, v_dim,
                BLOCK_K=next_power_of_2(k_dim), BLOCK_V=next_power_of_2(v_dim))
    return out
