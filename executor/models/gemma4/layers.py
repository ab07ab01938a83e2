"""Gemma 4's layer parts, named as its checkpoints name them so weights load by name.

Its norms differ from Gemma 2/3's: the weight multiplies the normed input as it is (no
1 + w), and the value norm has no weight at all. Attention has no query scale (q and k are
RMS-normed per head). A layer sharing another's keys and values has only q_proj, q_norm and
o_proj: it reads the source layer's cache, which that layer wrote earlier in the same step.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from folio.executor.model_config import ModelConfig
from folio.executor.ops import AttentionInputs, KernelOps


class Gemma4Norm(nn.Module):
    """x * (mean(x^2) + eps)^-0.5 [* weight], in float32, rounded to x's dtype once."""

    def __init__(self, size: int, eps: float, with_scale: bool = True) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(size)) if with_scale else None
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        hidden = x.float()
        # torch.pow rather than rsqrt, as transformers (the last bit of float32 agrees).
        hidden = hidden * torch.pow(hidden.pow(2).mean(-1, keepdim=True) + self.eps, -0.5)
        if self.weight is not None:
            hidden = hidden * self.weight.float()
        return hidden.to(x.dtype)


def rotate(x: torch.Tensor, rows: torch.Tensor) -> torch.Tensor:
    """Rotary in the rotate-half form over the whole head, in x's dtype as transformers does
    (the global layers' proportional rope has frequency 0 past its share: cos 1, sin 0);
    rows: the cos/sin table's rows at the tokens' positions, [T, 1, head], in x's dtype."""
    half = x.shape[-1] // 2
    cos, sin = rows[..., :half], rows[..., half:]
    first, second = x[..., :half], x[..., half:]
    return torch.cat((first * cos - second * sin, second * cos + first * sin), dim=-1)


def fuse_linears(*parts: nn.Linear) -> nn.Linear:
    """One Linear computing `parts`' outputs side by side: one matmul instead of several."""
    first = parts[0]
    fused = nn.Linear(first.in_features, sum(p.out_features for p in parts),
                      bias=first.bias is not None, device=first.weight.device,
                      dtype=first.weight.dtype)
    with torch.no_grad():
        fused.weight.copy_(torch.cat([p.weight for p in parts]))
        if first.bias is not None:
            fused.bias.copy_(torch.cat([p.bias for p in parts]))
    return fused


class Gemma4Attention(nn.Module):
    def __init__(self, config: ModelConfig, layer: int, ops: KernelOps,
                 max_positions: int) -> None:
        super().__init__()
        spec = config.gemma4
        self.num_kv_heads, self.head_dim = spec.layer_heads[layer]
        self.num_heads = config.num_heads
        self.owns_cache = spec.kv_source[layer] == layer
        eps = config.rms_norm_eps
        self.q_proj = nn.Linear(config.hidden_size, self.num_heads * self.head_dim,
                                bias=config.qkv_bias)
        self.q_norm = Gemma4Norm(self.head_dim, eps)
        if self.owns_cache:
            kv_size = self.num_kv_heads * self.head_dim
            self.k_proj = nn.Linear(config.hidden_size, kv_size, bias=config.qkv_bias)
            # attention_k_eq_v (global layers): the values are the keys' projection.
            self.v_proj = None if spec.k_eq_v[layer] else nn.Linear(
                config.hidden_size, kv_size, bias=config.qkv_bias)
            self.k_norm = Gemma4Norm(self.head_dim, eps)
            self.v_norm = Gemma4Norm(self.head_dim, eps, with_scale=False)
        self.o_proj = nn.Linear(self.num_heads * self.head_dim, config.hidden_size,
                                bias=config.o_bias)
        window = config.layer_window(layer)
        self.window = window if window is not None and window < max_positions else None
        self.scale = config.attention_scale
        self.ops = ops
        self.qkv_proj: nn.Linear | None = None   # set by fuse(), after the weights load

    def fuse(self) -> None:
        """q/k/v (k/v: where it keeps a cache) in one qkv_proj, the parts dropped."""
        if not self.owns_cache:
            return
        parts = [self.q_proj, self.k_proj] + ([self.v_proj] if self.v_proj is not None else [])
        self.qkv_proj = fuse_linears(*parts)
        del self.q_proj, self.k_proj, self.v_proj

    def forward(self, rows: torch.Tensor, x: torch.Tensor,
                kv_cache: tuple[torch.Tensor, torch.Tensor], inputs: AttentionInputs
                ) -> torch.Tensor:
        """rows: this layer's rope rows at the step's positions (see `rotate`)."""
        tokens = x.shape[0]
        q_size, kv_size = self.num_heads * self.head_dim, self.num_kv_heads * self.head_dim
        if self.owns_cache:
            qkv = self.qkv_proj(x)
            q, k = qkv[:, :q_size], qkv[:, q_size:q_size + kv_size]
            v = k if qkv.shape[1] == q_size + kv_size else qkv[:, q_size + kv_size:]
        else:
            q = self.q_proj(x)
        q = rotate(self.q_norm(q.reshape(tokens, self.num_heads, self.head_dim)), rows)
        key_cache, value_cache = kv_cache
        if self.owns_cache:
            k = k.reshape(tokens, self.num_kv_heads, self.head_dim)
            v = v.reshape(tokens, self.num_kv_heads, self.head_dim)
            k = rotate(self.k_norm(k), rows)
            v = self.v_norm(v)
            self.ops.reshape_and_cache(k.contiguous(), v.contiguous(), key_cache, value_cache,
                                       inputs.slot_mapping)
        out = self.ops.attention(q.contiguous(), key_cache, value_cache, inputs, self.scale,
                                 window=self.window)
        return self.o_proj(out.reshape(tokens, self.num_heads * self.head_dim))


class Gemma4Mlp(nn.Module):
    """down(gelu_tanh(gate(x)) * up(x)), its own width per layer (double-wide on kv-shared
    layers with use_double_wide_mlp)."""

    def __init__(self, hidden: int, intermediate: int) -> None:
        super().__init__()
        self.gate_proj = nn.Linear(hidden, intermediate, bias=False)
        self.up_proj = nn.Linear(hidden, intermediate, bias=False)
        self.down_proj = nn.Linear(intermediate, hidden, bias=False)

        self.gate_up_proj: nn.Linear | None = None   # set by fuse()

    def fuse(self) -> None:
        self.gate_up_proj = fuse_linears(self.gate_proj, self.up_proj)
        del self.gate_proj, self.up_proj

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        gate, up = self.gate_up_proj(x).chunk(2, dim=-1)
        return self.down_proj(F.gelu(gate, approximate="tanh") * up)
