"""Mixture-of-experts feed-forward (Mixtral, Qwen3-MoE, and the hybrid MoE families): a
router picks the top-k experts of each token; the experts themselves run in ops.fused_moe,
grouped by expert."""

from __future__ import annotations

import torch
from torch import nn

from folio.executor.model_config import ModelConfig
from folio.executor.ops import KernelOps


class SparseMoe(nn.Module):
    """Router (gate) -> scores -> top-k -> the checkpoint's normalisation.

    Scores are a softmax in float32 (Mixtral, Qwen) or, for LFM2-MoE, a sigmoid in the model
    dtype whose top-k is chosen by score + expert_bias (kept in float32, as transformers
    keeps that buffer) while the weights stay the plain scores.

    Expert weights are stacked: w13 [E, 2*I, H] (rows 0:I gate, I:2I up), w2 [E, H, I]."""

    # hybrid/loader.py keeps these in float32 whatever the model dtype.
    float32_parameters: tuple[str, ...] = ("expert_bias",)

    def __init__(self, config: ModelConfig, ops: KernelOps) -> None:
        super().__init__()
        moe = config.moe
        assert moe is not None
        self.top_k = moe.top_k
        self.renormalize = moe.renormalize
        self.round_weights = moe.round_weights
        self.sigmoid = moe.scoring == "sigmoid"
        self.routed_scaling = moe.routed_scaling
        self.renorm_eps = moe.renorm_eps
        self.gate = nn.Linear(config.hidden_size, moe.num_experts, bias=False)
        self.w13 = nn.Parameter(torch.empty(moe.num_experts, 2 * moe.intermediate_size,
                                            config.hidden_size))
        self.w2 = nn.Parameter(torch.empty(moe.num_experts, config.hidden_size,
                                           moe.intermediate_size))
        self.expert_bias = nn.Parameter(torch.empty(moe.num_experts)) \
            if moe.expert_bias else None
        self.ops = ops

    def route(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(top-k weights, expert ids) of each token."""
        logits = self.gate(x)
        if self.sigmoid:
            probs = logits.sigmoid()
            if self.expert_bias is not None:
                ids = torch.topk(probs + self.expert_bias.float(), self.top_k, dim=-1)[1]
                weights = probs.gather(-1, ids)
            else:
                weights, ids = torch.topk(probs, self.top_k, dim=-1)
        else:
            probs = torch.softmax(logits.float(), dim=-1)
            weights, ids = torch.topk(probs, self.top_k, dim=-1)
        if self.renormalize:
            weights = weights / (weights.sum(dim=-1, keepdim=True) + self.renorm_eps)
        if self.routed_scaling != 1.0:
            weights = weights * self.routed_scaling
        if self.round_weights:   # Qwen rounds them to the model dtype; Mixtral does not
            weights = weights.to(x.dtype)
        return weights.float(), ids

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        weights, ids = self.route(x)
        return self.ops.fused_moe(x, self.w13, self.w2, weights, ids)
