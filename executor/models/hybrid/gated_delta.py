"""The gated delta rule (Gated DeltaNet's linear attention), in torch, in float32.

Per value head the state S is a [k_dim, v_dim] matrix. Each token t, with its decay g_t <= 0
(log space), write strength beta_t, and l2-normed key k_t and query q_t:
    S <- exp(g_t) S;   S <- S + k_t (beta_t (v_t - k_t^T S))^T;   o_t = (q_t / sqrt(k_dim))^T S
`recurrent` runs that literally (the decode step); `chunked` computes the same outputs and
final state a chunk of tokens at a time (prompts): within a chunk the writes are solved as
one unit-lower-triangular system, so the sequential work is one matrix product per chunk.
Shapes: q, k [L, H, Dk] (already repeated to the value heads), v [L, H, Dv], g, beta [L, H],
state [H, Dk, Dv]; the outputs are [L, H, Dv]."""

from __future__ import annotations

import torch

from folio.kernels import cpu_recurrent

CHUNK = 64


def l2_normalize(x: torch.Tensor, eps: float = 1e-6) -> torch.Tensor:
    return x * torch.rsqrt((x * x).sum(dim=-1, keepdim=True) + eps)


def prepare_qk(q: torch.Tensor, k: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """float32, l2-normed per head; the query scaled by k_dim ** -0.5."""
    q = l2_normalize(q.float())
    k = l2_normalize(k.float())
    return q * q.shape[-1] ** -0.5, k


def recurrent(q, k, v, g, beta, state):
    """One token at a time; q, k prepared (prepare_qk). Batched over a leading dimension
    too: q [B, H, Dk] with state [B, H, Dk, Dv] is one decode step of B requests (L = B,
    one token each). Returns (outputs, final state)."""
    if state.dim() == 4:   # one token for each of B states
        state = state * g.exp()[..., None, None]
        remembered = (state * k.unsqueeze(-1)).sum(dim=-2)
        delta = (v.float() - remembered) * beta.float().unsqueeze(-1)
        state = state + k.unsqueeze(-1) * delta.unsqueeze(-2)
        return (state * q.unsqueeze(-1)).sum(dim=-2), state
    outputs = torch.empty(v.shape, dtype=torch.float32, device=v.device)
    for t in range(q.shape[0]):
        out, state = recurrent(q[t:t + 1], k[t:t + 1], v[t:t + 1], g[t:t + 1],
                                      beta[t:t + 1], state.unsqueeze(0))
        outputs[t], state = out[0], state[0]
    return outputs, state


def recurrent_in_pool(q, k, v, g, beta, pool, slots, fresh: list[bool]):
    """`recurrent`'s batched decode step in C++ on CPU (kernels/cpu/gated_delta.cpp): each
    request's state is read and written in its slot of `pool` [S, H, Dk, Dv], none gathered;
    fresh requests start from zeros. Returns the outputs [B, H, Dv] float32."""
    return cpu_recurrent.gated_delta_step_cpu(q, k, v, g, beta, pool, slots, fresh)


def chunked_in_pool(q, k, v, g, beta, pool, slot: int, fresh: bool):
    """`chunked`'s meaning in C++ on CPU (kernels/cpu/gated_delta_chunk.cpp, a blocked
    recurrence in the decode step's order): one request's L tokens from its state in slot
    `slot` of `pool` [S, H, Dk, Dv] (zeros when fresh), left there after them. Returns
    the outputs [L, H, Dv] float32."""
    return cpu_recurrent.gated_delta_prompt_cpu(q, k, v, g, beta, pool, slot, fresh)


def prompt_in_pool_triton(q, k, v, g, beta, pool, slot: int, fresh: bool):
    """`chunked_in_pool` in Triton (kernels/triton_gated_delta.py `delta_rule_prompt`, a
    per-(head, column block) recurrence with the decode step's sums): on CUDA, or on CPU
    under TRITON_INTERPRET=1. Returns the outputs [L, H, Dv] float32."""
    from folio.kernels.triton_gated_delta import delta_rule_prompt   # imports triton

    return delta_rule_prompt(q.contiguous(), k.contiguous(), v.contiguous(), g.contiguous(),
                             beta.contiguous(), pool, slot, fresh)


def chunked(q, k, v, g, beta, state, chunk: int = CHUNK):
    """The same as `recurrent` over L tokens of one request, a chunk at a time."""
    length = q.shape[0]
    pad = (-length) % chunk
    # [H, n, C, D]: heads first, then chunks; padding tokens (g = 0, beta = 0) write nothing.
    def split(x):
        x = x.float().transpose(0, 1)
        if pad:
            x = torch.nn.functional.pad(x, (0, 0, 0, pad) if x.dim() == 3 else (0, pad))
        return x.reshape(x.shape[0], -1, chunk, *x.shape[2:])
    q, k, v, g, beta = map(split, (q, k, v, g, beta))
    decay = g.cumsum(dim=-1)                                     # [H, n, C]
    causal = torch.ones(chunk, chunk, dtype=torch.bool, device=q.device).tril()
    # exp(decay_i - decay_j) for j <= i, 0 above the diagonal.
    between = (decay.unsqueeze(-1) - decay.unsqueeze(-2)).masked_fill(~causal, float("-inf")).exp()
    k_beta = k * beta.unsqueeze(-1)
    # The chunk's writes interact through (I + strictly lower(k_beta k^T between)).
    system = (k_beta @ k.transpose(-1, -2)) * between
    solve = lambda rhs: torch.linalg.solve_triangular(system, rhs, upper=False,
                                                      unitriangular=True)
    values = solve(v * beta.unsqueeze(-1))                        # what each write adds
    keys_decayed = solve(k_beta * decay.exp().unsqueeze(-1))      # what it reads of S
    scores = (q @ k.transpose(-1, -2)) * between                  # within the chunk
    q_decayed = q * decay.exp().unsqueeze(-1)
    last = decay[..., -1:]
    k_to_end = k * (last - decay).exp().unsqueeze(-1)
    chunk_decay = last.exp().unsqueeze(-1)                        # [H, n, 1, 1]
    state = state.float()
    out = torch.empty_like(values)
    for i in range(q.shape[1]):
        fresh = values[:, i] - keys_decayed[:, i] @ state
        out[:, i] = q_decayed[:, i] @ state + scores[:, i] @ fresh
        state = state * chunk_decay[:, i] + k_to_end[:, i].transpose(-1, -2) @ fresh
    out = out.reshape(out.shape[0], -1, out.shape[-1])[:, :length]
    return out.transpose(0, 1), state


def recurrent_states_in_cpp(q, k, v, g, beta, state):
    """`recurrent_states` with each token through the C++ decode step (on a one-slot copy
    of `state`), so a drafted sequence computes exactly what decoding it would."""
    scratch = state.unsqueeze(0).clone()
    slot = torch.zeros(1, dtype=torch.int64, device=state.device)
    outputs = torch.empty(v.shape, dtype=torch.float32, device=v.device)
    states = torch.empty((q.shape[0], *state.shape), dtype=torch.float32, device=v.device)
    for t in range(q.shape[0]):
        outputs[t] = recurrent_in_pool(q[t:t + 1], k[t:t + 1], v[t:t + 1], g[t:t + 1],
                                       beta[t:t + 1], scratch, slot, [False])[0]
        states[t] = scratch[0]
    return outputs, states


def recurrent_states(q, k, v, g, beta, state):
    """`recurrent` over L tokens of one request, keeping the state after every token
    ([L, H, Dk, Dv]): speculative verification commits the one after the last accepted
    token. Each token is the decode step's own arithmetic, so the outputs and states are
    those of decoding the tokens one step at a time."""
    outputs = torch.empty(v.shape, dtype=torch.float32, device=v.device)
    states = torch.empty((q.shape[0], *state.shape), dtype=torch.float32, device=v.device)
    for t in range(q.shape[0]):
        out, state = recurrent(q[t:t + 1], k[t:t + 1], v[t:t + 1], g[t:t + 1],
                               beta[t:t + 1], state.unsqueeze(0))
        outputs[t], state = out[0], state[0]
        states[t] = state
    return outputs, states
