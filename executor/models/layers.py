"""Building blocks every architecture shares: norms, attention over the paged cache with
its per-architecture options, and the gated MLP.

Layer names (qkv_proj, o_proj, gate_up_proj, down_proj) are the same in every architecture,
so weight loading and any later per-rank slicing treat them alike.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from folio.executor.model_config import ModelConfig
from folio.executor.ops import AttentionInputs, KernelOps


class RMSNorm(nn.Module):
    """Llama's RMSNorm (weight times the normed input, rounded to its dtype first)."""

    def __init__(self, size: int, eps: float, ops: KernelOps) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(size))
        self.eps = eps
        self.ops = ops

    def forward(self, x: torch.Tensor, residual: torch.Tensor | None = None):
        return self.ops.rms_norm(x, self.weight, self.eps, residual)


class GemmaRMSNorm(nn.Module):
    """Gemma's RMSNorm: scaled by (1 + weight), all in float32, rounded once at the end.
    `offset` is that 1: 0 where a GGUF file stores the scale 1 + weight itself
    (hold_stored_scales), since weight = scale - 1 is not exact in float32 for every scale."""

    def __init__(self, size: int, eps: float) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.zeros(size))
        self.eps = eps
        self.offset = 1.0

    def forward(self, x: torch.Tensor, residual: torch.Tensor | None = None):
        if residual is not None:
            x = x + residual
            residual = x
        hidden = x.float()
        hidden = hidden * torch.rsqrt(hidden.pow(2).mean(-1, keepdim=True) + self.eps)
        normed = (hidden * (self.offset + self.weight.float())).to(x.dtype)
        return normed if residual is None else (normed, residual)


def hold_stored_scales(model: nn.Module) -> None:
    """A GGUF file of Gemma stores each norm's scale 1 + weight (llama.cpp's converter adds
    the 1): the norms multiply by it as it is, kept in float32 (in bfloat16 the scale would
    lose the weight's low bits, which 1 + weight computed in float32 keeps)."""
    for module in model.modules():
        if isinstance(module, GemmaRMSNorm):
            module.offset = 0.0
            module.weight = nn.Parameter(module.weight.float(), requires_grad=False)


def make_norm(config: ModelConfig, size: int, ops: KernelOps) -> nn.Module:
    if config.gemma:
        return GemmaRMSNorm(size, config.rms_norm_eps)
    return RMSNorm(size, config.rms_norm_eps, ops)


class Attention(nn.Module):
    def __init__(self, config: ModelConfig, layer: int, ops: KernelOps,
                 max_positions: int) -> None:
        super().__init__()
        self.num_heads = config.num_heads
        self.num_kv_heads = config.num_kv_heads
        self.head_dim = config.head_dim
        self.q_size = config.num_heads * config.head_dim
        self.kv_size = config.num_kv_heads * config.head_dim
        self.scale = config.attention_scale
        self.qkv_proj = nn.Linear(config.hidden_size, self.q_size + 2 * self.kv_size,
                                  bias=config.qkv_bias)
        self.o_proj = nn.Linear(self.q_size, config.hidden_size, bias=config.o_bias)
        # OLMo: one norm over all the heads of q (of k), before they are split.
        self.qk_norm_whole = config.qk_norm_whole
        q_width, k_width = ((self.q_size, self.kv_size) if config.qk_norm_whole
                            else (config.head_dim, config.head_dim))
        self.q_norm = make_norm(config, q_width, ops) if config.qk_norm else None
        self.k_norm = make_norm(config, k_width, ops) if config.qk_norm else None
        self.rotary_dim = config.rotary_dim
        self.rotary = config.layer_rotary(layer)   # SmolLM3: some layers have no rotary
        # gpt-oss: a learned logit per head in every row's softmax denominator.
        self.sinks = nn.Parameter(torch.empty(config.num_heads)) \
            if config.attention_sinks else None
        window = config.layer_window(layer)
        # A window as long as the longest context served excludes nothing: full attention.
        self.window = window if window is not None and window < max_positions else None
        self.softcap = config.attn_softcap
        self.ops = ops

    def forward(self, positions: torch.Tensor, x: torch.Tensor, cos_sin: torch.Tensor,
                kv_cache: tuple[torch.Tensor, torch.Tensor], inputs: AttentionInputs
                ) -> torch.Tensor:
        tokens = x.shape[0]
        q, k, v = self.qkv_proj(x).split([self.q_size, self.kv_size, self.kv_size], dim=-1)
        if self.q_norm is not None and self.qk_norm_whole:
            q, k = self.q_norm(q), self.k_norm(k)
        elif self.q_norm is not None:   # per head, before rotary
            q = self.q_norm(q.reshape(-1, self.head_dim))
            k = self.k_norm(k.reshape(-1, self.head_dim))
        q = q.view(tokens, self.num_heads, self.head_dim)
        k = k.view(tokens, self.num_kv_heads, self.head_dim)
        v = v.view(tokens, self.num_kv_heads, self.head_dim)
        if self.rotary:
            q, k = self._rotary(positions, q, k, cos_sin)
        key_cache, value_cache = kv_cache
        self.ops.reshape_and_cache(k, v, key_cache, value_cache, inputs.slot_mapping)
        if self.sinks is None:
            out = self.ops.attention(q, key_cache, value_cache, inputs, self.scale,
                                     window=self.window, softcap=self.softcap)
        else:
            out = self.ops.attention(q, key_cache, value_cache, inputs, self.scale,
                                     window=self.window, softcap=self.softcap, sinks=self.sinks)
        return self.o_proj(out.reshape(tokens, self.q_size))

    def _rotary(self, positions, q, k, cos_sin):
        if self.rotary_dim is None:
            return self.ops.rotary(positions, q, k, cos_sin)
        # Partial rotary (Phi-3 family): only the first rotary_dim of each head turns.
        dim = self.rotary_dim
        q_rot, k_rot = self.ops.rotary(positions, q[..., :dim].contiguous(),
                                       k[..., :dim].contiguous(), cos_sin)
        return torch.cat((q_rot, q[..., dim:]), dim=-1), torch.cat((k_rot, k[..., dim:]), dim=-1)


class GatedMLP(nn.Module):
    """down(act(gate(x)) * up(x)) with gate and up in one gate_up_proj."""

    def __init__(self, config: ModelConfig, ops: KernelOps,
                 intermediate_size: int | None = None) -> None:
        super().__init__()
        inter = intermediate_size or config.intermediate_size
        self.ops = ops
        self.act = config.hidden_act
        self.gate_up_proj = nn.Linear(config.hidden_size, 2 * inter, bias=config.mlp_bias)
        self.down_proj = nn.Linear(inter, config.hidden_size, bias=config.mlp_bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        gate_up = self.gate_up_proj(x)
        if self.act == "silu":
            return self.down_proj(self.ops.silu_and_mul(gate_up))
        gate, up = gate_up.chunk(2, dim=-1)
        return self.down_proj(F.gelu(gate, approximate="tanh") * up)


def final_logits(lm_head: nn.Module, hidden: torch.Tensor, cap: float | None) -> torch.Tensor:
    """The LM head's logits in float32, soft-capped (Gemma 2/3/4's final_logit_softcapping)
    when the model has a cap."""
    logits = lm_head(hidden)
    if cap is not None:
        logits = torch.tanh(logits / cap) * cap
    return logits.float()
