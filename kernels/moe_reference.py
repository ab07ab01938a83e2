"""Mixture-of-experts feed-forward in plain torch: the meaning of `fused_moe` and its CPU path.

    fused_moe_ref(hidden [T, H], w13 [E, 2*I, H], w2 [E, H, I],
                  topk_weights [T, k] float32, topk_ids [T, k] int, activation="silu") -> [T, H]

For each token t: sum over j < k of topk_weights[t, j] * expert(topk_ids[t, j], hidden[t]), where
expert(e, x) = w2[e] @ (act(w13[e][:I] @ x) * (w13[e][I:] @ x)), the gated MLP of each
Mixtral / Qwen3-MoE expert with gate and up stacked in w13; act is SiLU, or GELU's tanh
form for Gemma 4's experts (activation="gelu_tanh").

Grouped, not per token: the T*k (token, expert) pairs are sorted by expert, so each expert that
has tokens runs one [n_e, H] x [H, 2I] and one [n_e, I] x [I, H] matmul over all its tokens; the
weighted results are summed back into their tokens' rows. Each expert's MLP runs in the input
dtype (as the checkpoint's modules do); the routing weights multiply and the sum over k
accumulates in float32, rounded to the input dtype once at the end.
"""

from __future__ import annotations

import torch

from folio.kernels._checks import FLOAT_DTYPES, INDEX_DTYPES, check_same_device, check_shape, \
    check_tensor
from folio.kernels.reference import silu_and_mul_ref

ACTIVATIONS = ("silu", "gelu_tanh")


def check_activation(activation: str) -> None:
    if activation not in ACTIVATIONS:
        raise ValueError(f"activation must be one of {', '.join(ACTIVATIONS)}, got "
                         f"{activation!r}")


def gated_activation(gate_up: torch.Tensor, activation: str = "silu") -> torch.Tensor:
    """act(gate) * up of [.., 2I] rows, gate first, in their dtype."""
    if activation == "silu":
        return silu_and_mul_ref(gate_up)
    gate, up = gate_up.chunk(2, dim=-1)
    return torch.nn.functional.gelu(gate, approximate="tanh") * up


def check_moe_args(hidden: torch.Tensor, w13: torch.Tensor, w2: torch.Tensor,
                   topk_weights: torch.Tensor, topk_ids: torch.Tensor) -> tuple[int, int, int]:
    """Kinds, dtypes, shapes and devices of fused_moe's arguments; returns (E, I, k).

    Expert ids are device values and are not checked here (that would sync the device)."""
    check_tensor("hidden", hidden, ndim=2, dtypes=FLOAT_DTYPES)
    check_tensor("w13", w13, ndim=3, dtypes=(hidden.dtype,))
    check_tensor("w2", w2, ndim=3, dtypes=(hidden.dtype,))
    check_tensor("topk_weights", topk_weights, ndim=2, dtypes=FLOAT_DTYPES)
    check_tensor("topk_ids", topk_ids, ndim=2, dtypes=INDEX_DTYPES)
    tokens, hidden_size = hidden.shape
    experts, twice_inter = w13.shape[0], w13.shape[1]
    if experts < 1:
        raise ValueError(f"w13 must hold at least one expert, got shape {tuple(w13.shape)}")
    if twice_inter < 2 or twice_inter % 2:
        raise ValueError(f"w13's second dimension must be 2 * intermediate_size (even, > 0), "
                         f"got shape {tuple(w13.shape)}")
    inter = twice_inter // 2
    check_shape("w13", w13, (experts, 2 * inter, hidden_size))
    check_shape("w2", w2, (experts, hidden_size, inter))
    top_k = topk_ids.shape[1]
    if not 1 <= top_k <= experts:
        raise ValueError(f"topk_ids must pick between 1 and {experts} experts per token, got "
                         f"shape {tuple(topk_ids.shape)}")
    check_shape("topk_ids", topk_ids, (tokens, top_k))
    check_shape("topk_weights", topk_weights, (tokens, top_k))
    check_same_device("hidden", hidden, w13=w13, w2=w2, topk_weights=topk_weights,
                      topk_ids=topk_ids)
    return experts, inter, top_k


def sort_by_expert(topk_ids: torch.Tensor, num_experts: int
                   ) -> tuple[torch.Tensor, list[int]]:
    """(pair order, tokens per expert): the flat (token, slot) pair indices t*k + j sorted by
    expert (stable, so each expert's tokens stay in token order), and how many each got."""
    flat = topk_ids.reshape(-1)
    order = torch.argsort(flat, stable=True)
    counts = torch.bincount(flat, minlength=num_experts)
    if counts.numel() > num_experts or (flat.numel() and int(flat.min()) < 0):
        raise ValueError(f"topk_ids must be expert ids in [0, {num_experts}), got "
                         f"{int(flat.min())}..{int(flat.max())}")
    return order, counts.tolist()


def fused_moe_ref(hidden: torch.Tensor, w13: torch.Tensor, w2: torch.Tensor,
                  topk_weights: torch.Tensor, topk_ids: torch.Tensor,
                  activation: str = "silu") -> torch.Tensor:
    """The MoE feed-forward of the module docstring, grouped by expert."""
    experts, _, top_k = check_moe_args(hidden, w13, w2, topk_weights, topk_ids)
    check_activation(activation)
    return grouped_moe(hidden, w13, w2, topk_weights, topk_ids, experts, top_k, activation)


def grouped_moe(hidden: torch.Tensor, w13: torch.Tensor, w2: torch.Tensor,
                topk_weights: torch.Tensor, topk_ids: torch.Tensor, experts: int, top_k: int,
                activation: str = "silu") -> torch.Tensor:
    """fused_moe_ref after its argument checks (for callers that made them)."""
    out = torch.zeros(hidden.shape, dtype=torch.float32, device=hidden.device)
    if hidden.shape[0] == 0:
        return out.to(hidden.dtype)
    if hidden.shape[0] == 1:
        return _one_token(hidden, w13, w2, topk_weights, topk_ids, experts, activation)
    order, counts = sort_by_expert(topk_ids, experts)
    token_of_pair = order // top_k
    rows = hidden[token_of_pair]                     # every pair's input, grouped by expert
    down = torch.empty_like(rows)
    start = 0
    for expert, count in enumerate(counts):
        if count == 0:
            continue
        end = start + count
        gate_up = torch.mm(rows[start:end], w13[expert].t())
        torch.mm(gated_activation(gate_up, activation), w2[expert].t(),
                 out=down[start:end])
        start = end
    weight_of_pair = topk_weights.reshape(-1).to(torch.float32)[order]
    out.index_add_(0, token_of_pair, down.to(torch.float32) * weight_of_pair[:, None])
    return out.to(hidden.dtype)


def _one_token(hidden, w13, w2, topk_weights, topk_ids, experts: int,
               activation: str = "silu") -> torch.Tensor:
    """A decode of one sequence: its k experts directly, without the sort, gather and scatter
    (a third of the time at small expert sizes), rounding as the grouped path does and summing
    in its order (by expert id)."""
    ids = topk_ids[0].tolist()
    if min(ids) < 0 or max(ids) >= experts:
        raise ValueError(f"topk_ids must be expert ids in [0, {experts}), got "
                         f"{min(ids)}..{max(ids)}")
    weights = topk_weights[0].to(torch.float32)
    out = None
    for j in sorted(range(len(ids)), key=ids.__getitem__):
        gate_up = torch.mm(hidden, w13[ids[j]].t())
        term = torch.mm(gated_activation(gate_up, activation),
                        w2[ids[j]].t()).to(torch.float32) * weights[j]
        out = term if out is None else out.add_(term)
    return out.to(hidden.dtype)
