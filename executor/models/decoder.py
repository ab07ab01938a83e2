"""The decoder every supported architecture is built from, over a paged KV cache.

Tokens of all scheduled requests are flattened into one [T, hidden] batch; attention reads
each request's context from the paged cache through its block table. The residual stream
travels beside the hidden state, so each norm can fuse "add the residual, then norm".
"""

from __future__ import annotations

import torch
from torch import nn

from folio.executor.model_config import ModelConfig
from folio.executor.models.gpt_oss.moe import GptOssMoe
from folio.executor.models.layers import Attention, GatedMLP, final_logits, make_norm
from folio.executor.models.moe import SparseMoe
from folio.executor.ops import AttentionInputs, KernelOps
from folio.executor.rotary import longrope_positions, rotary_cos_sin_cache


class DecoderLayer(nn.Module):
    def __init__(self, config: ModelConfig, layer: int, ops: KernelOps,
                 max_positions: int) -> None:
        super().__init__()
        size = config.hidden_size
        # OLMo ("post"): no norm before the sublayers; each one's output is normed, then
        # added to the residual stream.
        self.post_norms = config.norms == "post"
        if not self.post_norms:
            self.input_layernorm = make_norm(config, size, ops)
        self.self_attn = Attention(config, layer, ops, max_positions)
        # Llama: post_attention_layernorm is the norm before the MLP. Gemma: it norms the
        # attention output, and pre/post_feedforward_layernorm wrap the MLP.
        self.post_attention_layernorm = make_norm(config, size, ops)
        self.sandwich = config.gemma
        if self.sandwich:
            self.pre_feedforward_layernorm = make_norm(config, size, ops)
        if self.sandwich or self.post_norms:
            self.post_feedforward_layernorm = make_norm(config, size, ops)
        sparse = config.moe is not None and config.moe.sparse_layers[layer]
        if sparse and config.moe.swiglu is not None:
            self.mlp = GptOssMoe(config)
        else:
            self.mlp = SparseMoe(config, ops) if sparse else GatedMLP(config, ops)

    def forward(self, positions, hidden, residual, cos_sin, kv_cache, inputs):
        if self.post_norms:
            return self._forward_post_norms(positions, hidden, residual, cos_sin, kv_cache,
                                            inputs)
        if residual is None:
            residual = hidden
            hidden = self.input_layernorm(hidden)
        else:
            hidden, residual = self.input_layernorm(hidden, residual)
        hidden = self.self_attn(positions, hidden, cos_sin, kv_cache, inputs)
        if not self.sandwich:
            hidden, residual = self.post_attention_layernorm(hidden, residual)
            return self.mlp(hidden), residual
        hidden = self.post_attention_layernorm(hidden)
        hidden, residual = self.pre_feedforward_layernorm(hidden, residual)
        return self.post_feedforward_layernorm(self.mlp(hidden)), residual

    def _forward_post_norms(self, positions, hidden, residual, cos_sin, kv_cache, inputs):
        # The stream is hidden + residual, as the next norm adds it (here: the next layer, or
        # the final norm).
        if residual is not None:
            hidden = hidden + residual
        attended = self.self_attn(positions, hidden, cos_sin, kv_cache, inputs)
        residual = hidden + self.post_attention_layernorm(attended)
        return self.post_feedforward_layernorm(self.mlp(residual)), residual


class CausalLM(nn.Module):
    def __init__(self, config: ModelConfig, ops: KernelOps, max_positions: int) -> None:
        super().__init__()
        self.config = config
        # Given its (uninitialised) weight, the embedding skips its random init: on the meta
        # device that init runs through torch's Python references, which import
        # torch._dynamo (1.5 s of every executor start). The checkpoint fills it anyway.
        self.embed_tokens = nn.Embedding(config.vocab_size, config.hidden_size,
                                         _weight=torch.empty(config.vocab_size,
                                                             config.hidden_size))
        self.layers = nn.ModuleList(DecoderLayer(config, i, ops, max_positions)
                                    for i in range(config.num_layers))
        self.norm = make_norm(config, config.hidden_size, ops)
        self.lm_head = nn.Linear(config.hidden_size, config.vocab_size, bias=False)
        self.max_positions = max_positions
        # One cos/sin table per distinct rope (Gemma 3: global and local layers differ).
        ropes = [config.layer_rope(i) for i in range(config.num_layers)]
        self.ropes = list(dict.fromkeys(ropes))
        self.layer_table = [self.ropes.index(r) for r in ropes]
        self.tables: list[torch.Tensor] = []
        # The length past which longrope switches factors and the executor recomputes a
        # crossing sequence (executor/models/longrope.py). Not with a window shorter than the
        # context: the blocks behind it may be freed, so the cached part cannot be redone.
        windowed = any(layer.self_attn.window is not None for layer in self.layers)
        self.longrope_original = config.rope.original_max_position_embeddings \
            if config.rope.rope_type == "longrope" and not windowed else None
        # executor/native_step's NativeStep, set at load where it can run this model: steps
        # of up to its max_tokens run every layer in one C++ call instead of the loop.
        self.native_step = None
        # The LoRA registry's step (executor/lora/registry.py sets it): its adapter groups.
        self.lora_step = None

    def init_rotary(self) -> None:
        """Fill the cos/sin tables (after weights are on their device)."""
        dim = self.config.rotary_dim or self.config.head_dim
        device = self.embed_tokens.weight.device
        self.tables = [rotary_cos_sin_cache(rope, dim, self.max_positions, device)
                       for rope in self.ropes]

    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor,
                kv_caches: list[tuple[torch.Tensor, torch.Tensor]],
                inputs: AttentionInputs, long_rope: bool = False) -> torch.Tensor:
        """`long_rope`: every token reads the long-factor rows (longrope's recompute)."""
        hidden = self.embed_tokens(input_ids)
        if self.config.gemma:   # scaled by sqrt(hidden) in the model dtype, as Gemma does
            hidden = hidden * torch.tensor(self.config.hidden_size ** 0.5, dtype=hidden.dtype)
        rope = self.config.rope
        if rope.rope_type == "longrope" and long_rope:
            positions = positions + self.max_positions
        elif rope.rope_type == "longrope":   # rows of the long-factor half where needed
            positions = longrope_positions(positions, inputs.seq_lens, inputs.query_start_loc,
                                           rope.original_max_position_embeddings,
                                           self.max_positions)
        native = self.native_step
        # A step with LoRA adapter rows runs the layers, which add the adapters' terms.
        lora = self.lora_step
        if (native is not None and len(input_ids) <= native.max_tokens
                and not (lora is not None and lora.groups)):
            hidden, residual = native(positions, hidden, kv_caches, inputs)
        else:
            residual = None
            for layer, table, kv_cache in zip(self.layers, self.layer_table, kv_caches):
                hidden, residual = layer(positions, hidden, residual, self.tables[table],
                                         kv_cache, inputs)
        hidden, _ = self.norm(hidden, residual)
        return hidden

    def compute_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        return final_logits(self.lm_head, hidden, self.config.final_softcap)
