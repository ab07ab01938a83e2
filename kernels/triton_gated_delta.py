"""The gated delta rule (Gated DeltaNet, executor/models/hybrid/) on the state pool in place.
`delta_rule_step`, the decode step: one program per (request, value head) loads that head's
float32 [k_dim, v_dim] state from the request's slot (zeros for a fresh request), applies one
token
    S <- exp(g) S;   S <- S + k (beta (v - k^T S))^T;   o = q^T S
and writes S back and o out. `delta_rule_prompt`, a prompt's L tokens of one request: the
same rule token after token, per (value head, column block) of S, on the slot in place.
Meaning: executor/models/hybrid/gated_delta.py `recurrent` (q already l2-normed and scaled,
k l2-normed, all float32)."""

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


# The prompt kernel: a per-(value head, column block) recurrence rather than the chunked form.
# S's columns never mix under the rule, so a program holds its [Dk, BLOCK_V] stripe of S in
# registers for the whole prompt and runs the decode step's arithmetic token after token (the
# same sums as _delta_step_kernel, so a prompt computes what decoding it would).
PROMPT_BLOCK_V = 32


@triton.jit
def _delta_prompt_kernel(
    q_ptr, k_ptr, v_ptr, g_ptr, beta_ptr, state_ptr, out_ptr,
    length, heads, k_dim, v_dim,
    FRESH: tl.constexpr, BLOCK_K: tl.constexpr, BLOCK_V: tl.constexpr,
):
    head = tl.program_id(0).to(tl.int64)
    vs = tl.program_id(1) * BLOCK_V + tl.arange(0, BLOCK_V)
    ks = tl.arange(0, BLOCK_K)
    k_mask = ks < k_dim
    v_mask = vs < v_dim
    base = head * k_dim * v_dim   # state_ptr: the request's slot of the pool
    offsets = ks[:, None] * v_dim + vs[None, :]
    mask = k_mask[:, None] & v_mask[None, :]
    if FRESH:   # a fresh slot's old contents are never read
        state = tl.zeros((BLOCK_K, BLOCK_V), dtype=tl.float32)
    else:
        state = tl.load(state_ptr + base + offsets, mask=mask, other=0.0)
    for t in range(0, length):
        vec = t * heads + head
        q = tl.load(q_ptr + vec * k_dim + ks, mask=k_mask, other=0.0)
        k = tl.load(k_ptr + vec * k_dim + ks, mask=k_mask, other=0.0)
        v = tl.load(v_ptr + vec * v_dim + vs, mask=v_mask, other=0.0).to(tl.float32)
        g = tl.load(g_ptr + vec)
        beta = tl.load(beta_ptr + vec)
        state = state * tl.exp(g)
        remembered = tl.sum(state * k[:, None], axis=0)
        delta = (v - remembered) * beta
        state = state + k[:, None] * delta[None, :]
        out = tl.sum(state * q[:, None], axis=0)
        tl.store(out_ptr + vec * v_dim + vs, out, mask=v_mask)
    tl.store(state_ptr + base + offsets, state, mask=mask)


# Value dtypes the prompt kernel reads (it sums in float32 whatever the values' dtype).
PROMPT_VALUE_DTYPES = (torch.float32, torch.bfloat16, torch.float16)


def delta_rule_prompt(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, g: torch.Tensor,
                      beta: torch.Tensor, pool: torch.Tensor, slot: int,
                      fresh: bool) -> torch.Tensor:
    """One request's L tokens: q, k [L, H, Dk] float32 (prepared), v [L, H, Dv] float32,
    bfloat16 or float16, g, beta [L, H] float32; pool [S, H, Dk, Dv] float32, the request's
    state read from pool[slot] (zeros when fresh) and left there after the L tokens. One
    launch over (value head, block of 32 columns of S). Returns the outputs [L, H, Dv]
    float32."""
    length, heads, k_dim = q.shape
    v_dim = v.shape[-1]
    for name, tensor in (("q", q), ("k", k), ("g", g), ("beta", beta), ("pool", pool)):
        if tensor.dtype != torch.float32 or not tensor.is_contiguous():
            raise ValueError(f"{name} must be contiguous float32")
    if v.dtype not in PROMPT_VALUE_DTYPES or not v.is_contiguous():
        raise ValueError("v must be contiguous float32, bfloat16 or float16")
    if k.shape != q.shape or v.shape[:2] != (length, heads) or g.shape != (length, heads) \
            or beta.shape != (length, heads) or pool.shape[1:] != (heads, k_dim, v_dim):
        raise ValueError("delta_rule_prompt: shapes disagree")
    if not 0 <= slot < pool.shape[0]:
        raise ValueError(f"slot {slot} is outside the pool's {pool.shape[0]} slots")
    check_launch_device("pool", pool, _delta_prompt_kernel)
    out = torch.empty(v.shape, dtype=torch.float32, device=v.device)
    block_v = min(PROMPT_BLOCK_V, next_power_of_2(v_dim))
    if length:
        with on_device(pool):
            _delta_prompt_kernel[(heads, triton.cdiv(v_dim, block_v))](
                q, k, v, g, beta, pool[slot], out, length, heads, k_dim, v_dim,
                FRESH=bool(fresh), BLOCK_K=next_power_of_2(k_dim), BLOCK_V=block_v)
    elif fresh:   # no tokens from a fresh start: the state is zeros
        pool[slot].zero_()
    return out
