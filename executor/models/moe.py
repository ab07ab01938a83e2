"""Mixture-of-experts feed-forward (Mixtral, Qwen3-MoE): a router picks the top-k experts
of each token; the experts themselves run in ops.fused_moe, grouped by expert."""

from __future__ import annotations

import torch
from torch import nn

from folio.executor.model_config import ModelConfig
from folio.executor.ops import KernelOps


class SparseMoe(nn.Module):
    """Router (gate) -> softmax in float32 -> top-k -> the checkpoint's normalisation.

    Expert weights are stacked: w13 [E, 2*I, H] (rows 0:I gate, I:2I up), w2 [E, H, I]."""

    def __init__(self, config: ModelConfig, ops: KernelOps) -> None:
        super().__init__()
        moe = config.moe
        assert moe is not None
        self.top_k = moe.top_k
        self.renormalize = moe.renormalize
        self.round_weights = moe.round_weights
        self.gate = nn.Linear(config.hidden_size, moe.num_experts, bias=False)
        self.w13 = nn.Parameter(torch.empty(moe.num_experts, 2 * moe.intermediate_size,
                                            config.hidden_size))
        self.w2 = nn.Parameter(torch.empty(moe.num_experts, config.hidden_size,
                                           moe.intermediate_size))
        self.ops = ops

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        logits = self.gate(x)
        probs = torch.softmax(logits.float(), dim=-1)
        weights, ids = torch.topk(probs, self.top_k, dim=-1)
        if self.renormalize:
            weights = weights / weights.sum(dim=-1, keepdim=True)
        if self.round_weights:   # Qwen3-MoE rounds them to the model dtype; Mixtral does not
            weights = weights.to(x.dtype)
        return self.ops.fused_moe(x, self.w13, self.w2, weights.float(), ids)
