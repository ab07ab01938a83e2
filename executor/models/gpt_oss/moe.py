"""gpt-oss's experts: a router with a bias whose top-k logits are softmaxed, and experts with
biases and a clamped SwiGLU: (clamp(up, -l, l) + 1) * g * sigmoid(alpha * g), g = min(gate, l).

The expert weights stay in transformers' layout (gate and up interleaved in the columns of
w13 [E, H, 2I]; w2 [E, I, H]), so both the plain and the MXFP4 checkpoints load unchanged.
Experts run grouped: each expert once over the tokens routed to it, in expert order (the
order transformers adds them in, so the sums round alike)."""

from __future__ import annotations

import torch
from torch import nn

from folio.executor.model_config import ModelConfig


class GptOssMoe(nn.Module):
    def __init__(self, config: ModelConfig) -> None:
        super().__init__()
        moe = config.moe
        assert moe is not None and moe.swiglu is not None
        experts, hidden, inter = moe.num_experts, config.hidden_size, moe.intermediate_size
        self.top_k = moe.top_k
        self.alpha, self.limit = moe.swiglu
        self.router = nn.Linear(hidden, experts, bias=True)
        self.w13 = nn.Parameter(torch.empty(experts, hidden, 2 * inter))
        self.w13_bias = nn.Parameter(torch.empty(experts, 2 * inter))
        self.w2 = nn.Parameter(torch.empty(experts, inter, hidden))
        self.w2_bias = nn.Parameter(torch.empty(experts, hidden))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        logits = self.router(x)
        top, ids = torch.topk(logits, self.top_k, dim=-1)
        weights = torch.softmax(top, dim=1, dtype=top.dtype)
        out = torch.zeros_like(x)
        for expert in torch.unique(ids).tolist():
            tokens, slots = torch.where(ids == expert)
            gate_up = x[tokens] @ self.w13[expert] + self.w13_bias[expert]
            gate = gate_up[..., ::2].clamp(max=self.limit)
            up = gate_up[..., 1::2].clamp(min=-self.limit, max=self.limit)
            hidden = (up + 1) * (gate * torch.sigmoid(gate * self.alpha))
            expert_out = hidden @ self.w2[expert] + self.w2_bias[expert]
            out.index_add_(0, tokens, (expert_out * weights[tokens, slots, None]).to(x.dtype))
        return out
