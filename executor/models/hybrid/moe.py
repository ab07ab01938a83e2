"""The feed-forward of the hybrid MoE families (Qwen3.5-MoE, Qwen3-Next, LFM2-MoE): Folio's
SparseMoe (executor/models/moe.py, ops.fused_moe) on the sparse layers, Qwen's sigmoid-gated
shared expert beside it, the dense gated MLP on the others. Checkpoint names map onto these
modules in hybrid/moe_weights.py."""

from __future__ import annotations

import torch
from torch import nn

from folio.executor.model_config import ModelConfig
from folio.executor.models.hybrid.layers import GatedMlp
from folio.executor.models.moe import SparseMoe
from folio.executor.ops import KernelOps


class SharedExpertMoe(SparseMoe):
    """Qwen3-Next / Qwen3.5-MoE: the routed experts plus sigmoid(shared_expert_gate(x)) *
    shared_expert(x), every product in the model dtype, as transformers computes it."""

    def __init__(self, config: ModelConfig, ops: KernelOps) -> None:
        super().__init__(config, ops)
        size = config.moe.shared_expert_size
        self.shared_expert = GatedMlp(config, intermediate_size=size)
        self.shared_expert_gate = nn.Linear(config.hidden_size, 1, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        shared = torch.sigmoid(self.shared_expert_gate(x)) * self.shared_expert(x)
        return super().forward(x) + shared


def feed_forward(config: ModelConfig, layer: int, ops: KernelOps,
                 names: tuple[str, str, str] = ("gate_proj", "up_proj", "down_proj")
                 ) -> nn.Module:
    """The layer's feed-forward: experts where the config makes it sparse, else the dense
    gated MLP (its weights under `names`: gate, up, down)."""
    moe = config.moe
    if moe is None or not moe.sparse_layers[layer]:
        return GatedMlp(config, *names)
    return SharedExpertMoe(config, ops) if moe.shared_expert_size else SparseMoe(config, ops)
