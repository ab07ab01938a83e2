"""Gemma 4's MoE block (enable_moe_block, e.g. 26B-A4B), named as its checkpoints name it:
a router and routed experts that every layer runs beside its dense MLP, on the layer's
input (before the feed-forward norm).

The router RMS-normalises its input without a weight, scales it by a learned vector and
hidden_size^-0.5, and softmaxes the projection in float32; the top-k probabilities are
renormalised to sum to one, then multiplied by their experts' learned scales. The experts
are gated MLPs whose gate goes through GELU's tanh form, run by ops.fused_moe
(activation="gelu_tanh") on the stacked weights as stored: gate_up_proj [E, 2I, H] (gate
rows first) and down_proj [E, H, I]."""

from __future__ import annotations

import torch
from torch import nn

from folio.executor.models.gemma4.layers import Gemma4Norm
from folio.executor.models.gemma4.spec import Gemma4Moe
from folio.executor.ops import KernelOps


class Gemma4Router(nn.Module):
    def __init__(self, hidden: int, moe: Gemma4Moe, eps: float) -> None:
        super().__init__()
        self.top_k = moe.top_k
        self.root_size = hidden ** -0.5
        self.norm = Gemma4Norm(hidden, eps, with_scale=False)
        self.proj = nn.Linear(hidden, moe.num_experts, bias=False)
        self.scale = nn.Parameter(torch.ones(hidden))
        self.per_expert_scale = nn.Parameter(torch.ones(moe.num_experts))

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(top-k weights in float32, expert ids) of each token."""
        scores = self.proj(self.norm(x) * self.scale * self.root_size)
        probs = torch.softmax(scores, dim=-1, dtype=torch.float32)
        weights, ids = torch.topk(probs, self.top_k, dim=-1)
        weights = weights / weights.sum(dim=-1, keepdim=True)
        return weights * self.per_expert_scale[ids], ids


class Gemma4Experts(nn.Module):
    def __init__(self, hidden: int, moe: Gemma4Moe, ops: KernelOps) -> None:
        super().__init__()
        self.gate_up_proj = nn.Parameter(torch.empty(moe.num_experts,
                                                     2 * moe.intermediate_size, hidden))
        self.down_proj = nn.Parameter(torch.empty(moe.num_experts, hidden,
                                                  moe.intermediate_size))
        self.ops = ops

    def forward(self, x: torch.Tensor, weights: torch.Tensor, ids: torch.Tensor
                ) -> torch.Tensor:
        return self.ops.fused_moe(x, self.gate_up_proj, self.down_proj, weights.float(), ids,
                                  "gelu_tanh")
