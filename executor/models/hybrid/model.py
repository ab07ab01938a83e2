"""A hybrid causal LM: attention layers over the paged KV cache (kv_caches holds one entry
per attention layer, in order) and recurrent layers over the state pool, each token batch
flattened as in executor/models/decoder.py. Residuals are added in the model dtype, as
transformers does."""

from __future__ import annotations

import torch
from torch import nn

from folio.executor.model_config import ModelConfig
from folio.executor.models.hybrid.layers import GatedDeltaNet, HybridAttention, Norm, ShortConv
from folio.executor.models.hybrid.moe import feed_forward
from folio.executor.models.hybrid.spec import ATTENTION
from folio.executor.models.hybrid.state_pool import StatePool, StepStates
from folio.executor.ops import AttentionInputs, KernelOps
from folio.executor.rotary import rotary_cos_sin_cache
from folio.kernels import cpu_recurrent


class HybridLayer(nn.Module):
    def __init__(self, config: ModelConfig, layer: int, ops: KernelOps) -> None:
        super().__init__()
        qwen = config.hybrid.family == "qwen3_5"
        kind = config.hybrid.layer_kinds[layer]
        self.is_attention = kind == ATTENTION
        native = cpu_recurrent.runs_native(ops.name)   # C++ decode steps on CPU
        eps, size = config.rms_norm_eps, config.hidden_size
        if qwen:
            if self.is_attention:
                self.self_attn = HybridAttention(config, ops, gated=True)
            else:
                self.linear_attn = GatedDeltaNet(config, layer, native,
                                                 triton=ops.name == "triton")
            self.input_layernorm = Norm(size, eps, zero_centred=True)
            self.post_attention_layernorm = Norm(size, eps, zero_centred=True)
            self.mlp = feed_forward(config, layer, ops)
            self.mixer = self.self_attn if self.is_attention else self.linear_attn
            self.norms = (self.input_layernorm, self.post_attention_layernorm)
        else:
            if self.is_attention:
                self.self_attn = HybridAttention(config, ops, gated=False)
            else:
                self.conv = ShortConv(config, layer, native)
            self.operator_norm = Norm(size, eps, zero_centred=False)
            self.ffn_norm = Norm(size, eps, zero_centred=False)
            self.feed_forward = feed_forward(config, layer, ops, ("w1", "w3", "w2"))
            self.mixer = self.self_attn if self.is_attention else self.conv
            self.norms = (self.operator_norm, self.ffn_norm)
        self.ffn = self.mlp if qwen else self.feed_forward

    def forward(self, positions, hidden, cos_sin, kv_cache, inputs, pool, states):
        before, after = self.norms
        mixed = before(hidden)
        if self.is_attention:
            mixed = self.mixer(positions, mixed, cos_sin, kv_cache, inputs)
        else:
            mixed = self.mixer(mixed, pool, states)
        hidden = hidden + mixed
        return hidden + self.ffn(after(hidden))


class HybridCausalLM(nn.Module):
    def __init__(self, config: ModelConfig, ops: KernelOps, max_positions: int) -> None:
        super().__init__()
        self.config = config
        self.embed_tokens = nn.Embedding(config.vocab_size, config.hidden_size,
                                         _weight=torch.empty(config.vocab_size,
                                                             config.hidden_size))
        self.layers = nn.ModuleList(HybridLayer(config, i, ops)
                                    for i in range(config.num_layers))
        final = Norm(config.hidden_size, config.rms_norm_eps,
                     zero_centred=config.hybrid.family == "qwen3_5")
        if config.hybrid.family == "qwen3_5":
            self.norm = final
        else:
            self.embedding_norm = final
        self.final_norm = final
        self.lm_head = nn.Linear(config.hidden_size, config.vocab_size, bias=False)
        self.max_positions = max_positions
        # Which kv_caches entry each attention layer reads.
        self.kv_index = {layer: i for i, layer in enumerate(config.hybrid.attention_layers)}
        self.cos_sin = torch.empty(0)
        # executor/native_step's HybridNativeStep, set at load where it can run this model:
        # decode-only steps of up to its max_tokens run every layer in one C++ call.
        self.native_step = None
        self.longrope_original = None
        self.states: StatePool | None = None   # set by the executor (attach_states)

    def init_rotary(self) -> None:
        dim = self.config.rotary_dim or self.config.head_dim
        self.cos_sin = rotary_cos_sin_cache(self.config.rope, dim, self.max_positions,
                                            self.embed_tokens.weight.device)

    def attach_states(self, pool: StatePool) -> None:
        self.states = pool

    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor,
                kv_caches: list[tuple[torch.Tensor, torch.Tensor]], inputs: AttentionInputs,
                states: StepStates | None = None) -> torch.Tensor:
        if states is None:
            raise ValueError("a hybrid model's step needs its requests' state slots")
        hidden = self.embed_tokens(input_ids)
        native = self.native_step
        # One token per sequence and no drafts: what the C++ step runs (a drafted or
        # checkpointed sequence keeps per-position states, the layers' own business).
        if (native is not None and states.decode_only and len(input_ids) <= native.max_tokens
                and not any(states.drafted)):
            return self.final_norm(native(positions, hidden, kv_caches, inputs, self.states,
                                          states))
        kv_index = self.kv_index
        for index, layer in enumerate(self.layers):
            kv = kv_caches[kv_index[index]] if layer.is_attention else None
            hidden = layer(positions, hidden, self.cos_sin, kv, inputs, self.states, states)
        return self.final_norm(hidden)

    def compute_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        return self.lm_head(hidden).float()
