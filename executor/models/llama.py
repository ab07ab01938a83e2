"""Llama-family decoder (Llama, Mistral, Qwen2) over a paged KV cache.

Tokens of all scheduled requests are flattened into one [T, hidden] batch; attention reads
each request's context from the paged cache through its block table.
"""

from __future__ import annotations

import torch
from torch import nn

from executor.model_config import ModelConfig
from executor.ops import AttentionInputs, KernelOps
from executor.rotary import rotary_cos_sin_cache


class RMSNorm(nn.Module):
    def __init__(self, size: int, eps: float, ops: KernelOps) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(size))
        self.eps = eps
        self.ops = ops

    def forward(self, x: torch.Tensor, residual: torch.Tensor | None = None):
        return self.ops.rms_norm(x, self.weight, self.eps, residual)


class Attention(nn.Module):
    def __init__(self, config: ModelConfig, ops: KernelOps) -> None:
        super().__init__()
        self.num_heads = config.num_heads
        self.num_kv_heads = config.num_kv_heads
        self.head_dim = config.head_dim
        self.q_size = config.num_heads * config.head_dim
        self.kv_size = config.num_kv_heads * config.head_dim
        self.scale = config.head_dim ** -0.5
        self.qkv_proj = nn.Linear(config.hidden_size, self.q_size + 2 * self.kv_size,
                                  bias=config.qkv_bias)
        self.o_proj = nn.Linear(self.q_size, config.hidden_size, bias=config.o_bias)
        self.ops = ops

    def forward(self, positions: torch.Tensor, x: torch.Tensor, cos_sin: torch.Tensor,
                kv_cache: tuple[torch.Tensor, torch.Tensor], inputs: AttentionInputs
                ) -> torch.Tensor:
        tokens = x.shape[0]
        q, k, v = self.qkv_proj(x).split([self.q_size, self.kv_size, self.kv_size], dim=-1)
        q = q.view(tokens, self.num_heads, self.head_dim)
        k = k.view(tokens, self.num_kv_heads, self.head_dim)
        v = v.view(tokens, self.num_kv_heads, self.head_dim)
        q, k = self.ops.rotary(positions, q, k, cos_sin)
        key_cache, value_cache = kv_cache
        self.ops.reshape_and_cache(k, v, key_cache, value_cache, inputs.slot_mapping)
        out = self.ops.attention(q, key_cache, value_cache, inputs, self.scale)
        return self.o_proj(out.reshape(tokens, self.q_size))


class MLP(nn.Module):
    def __init__(self, config: ModelConfig, ops: KernelOps) -> None:
        super().__init__()
        self.ops = ops
        self.gate_up_proj = nn.Linear(config.hidden_size, 2 * config.intermediate_size,
                                      bias=config.mlp_bias)
        self.down_proj = nn.Linear(config.intermediate_size, config.hidden_size,
                                   bias=config.mlp_bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(self.ops.silu_and_mul(self.gate_up_proj(x)))


class DecoderLayer(nn.Module):
    def __init__(self, config: ModelConfig, ops: KernelOps) -> None:
        super().__init__()
        self.input_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps, ops)
        self.self_attn = Attention(config, ops)
        self.post_attention_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps, ops)
        self.mlp = MLP(config, ops)

    def forward(self, positions, hidden, residual, cos_sin, kv_cache, inputs):
        if residual is None:
            residual = hidden
            hidden = self.input_layernorm(hidden)
        else:
            hidden, residual = self.input_layernorm(hidden, residual)
        hidden = self.self_attn(positions, hidden, cos_sin, kv_cache, inputs)
        hidden, residual = self.post_attention_layernorm(hidden, residual)
        return self.mlp(hidden), residual


class LlamaForCausalLM(nn.Module):
    def __init__(self, config: ModelConfig, ops: KernelOps, max_positions: int) -> None:
        super().__init__()
        self.config = config
        self.embed_tokens = nn.Embedding(config.vocab_size, config.hidden_size)
        self.layers = nn.ModuleList(DecoderLayer(config, ops) for _ in range(config.num_layers))
        self.norm = RMSNorm(config.hidden_size, config.rms_norm_eps, ops)
        self.lm_head = nn.Linear(config.hidden_size, config.vocab_size, bias=False)
        self.max_positions = max_positions
        self.register_buffer("cos_sin", torch.empty(0), persistent=False)

    def init_rotary(self) -> None:
        """Fill the cos/sin table (after weights are on their device)."""
        self.cos_sin = rotary_cos_sin_cache(self.config.rope, self.config.head_dim,
                                            self.max_positions, self.embed_tokens.weight.device)

    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor,
                kv_caches: list[tuple[torch.Tensor, torch.Tensor]],
                inputs: AttentionInputs) -> torch.Tensor:
        hidden = self.embed_tokens(input_ids)
        residual = None
        for layer, kv_cache in zip(self.layers, kv_caches):
            hidden, residual = layer(positions, hidden, residual, self.cos_sin, kv_cache, inputs)
        hidden, _ = self.norm(hidden, residual)
        return hidden

    def compute_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        return self.lm_head(hidden).float()
