"""Gemma 4's text decoder over the paged KV cache (token batches flattened as in
executor/models/decoder.py; residuals added in the model dtype, as transformers does).

kv_caches holds one entry per layer that keeps a cache (ModelConfig.kv_cache_shapes); a
layer sharing keys and values reads its source's entry. Per-layer input embeddings (PLE):
each token's own slice of a packed [vocab, layers * width] table, mixed with a projection
of the embedded token, feeds a gated residual at the end of every layer. With the MoE block
(gemma4/moe.py) each layer's feed-forward is the dense MLP plus routed experts, each normed.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from folio.executor.model_config import ModelConfig
from folio.executor.models.gemma4.layers import Gemma4Attention, Gemma4Mlp, Gemma4Norm
from folio.executor.models.gemma4.moe import Gemma4Experts, Gemma4Router
from folio.executor.models.layers import final_logits
from folio.executor.ops import AttentionInputs, KernelOps
from folio.executor.rotary import rotary_cos_sin_cache


class Gemma4Layer(nn.Module):
    def __init__(self, config: ModelConfig, layer: int, ops: KernelOps,
                 max_positions: int) -> None:
        super().__init__()
        size, eps = config.hidden_size, config.rms_norm_eps
        self.self_attn = Gemma4Attention(config, layer, ops, max_positions)
        self.mlp = Gemma4Mlp(size, config.gemma4.mlp_sizes[layer])
        self.input_layernorm = Gemma4Norm(size, eps)
        self.post_attention_layernorm = Gemma4Norm(size, eps)
        self.pre_feedforward_layernorm = Gemma4Norm(size, eps)
        self.post_feedforward_layernorm = Gemma4Norm(size, eps)
        self.layer_scalar = nn.Parameter(torch.ones(1))   # a buffer in the checkpoint
        moe = config.gemma4.moe
        self.has_moe = moe is not None
        if moe is not None:   # routed experts beside the dense MLP
            self.router = Gemma4Router(size, moe, eps)
            self.experts = Gemma4Experts(size, moe, ops)
            self.post_feedforward_layernorm_1 = Gemma4Norm(size, eps)
            self.pre_feedforward_layernorm_2 = Gemma4Norm(size, eps)
            self.post_feedforward_layernorm_2 = Gemma4Norm(size, eps)
        width = config.gemma4.per_layer_input_size
        if width:
            self.per_layer_input_gate = nn.Linear(size, width, bias=False)
            self.per_layer_projection = nn.Linear(width, size, bias=False)
            self.post_per_layer_input_norm = Gemma4Norm(size, eps)

    def forward(self, rows, hidden, per_layer_input, kv_cache, inputs):
        attended = self.self_attn(rows, self.input_layernorm(hidden), kv_cache, inputs)
        hidden = hidden + self.post_attention_layernorm(attended)
        fed = self.mlp(self.pre_feedforward_layernorm(hidden))
        if self.has_moe:   # the router and the experts read the layer's input to the MLP
            weights, ids = self.router(hidden)
            routed = self.experts(self.pre_feedforward_layernorm_2(hidden), weights, ids)
            fed = self.post_feedforward_layernorm_1(fed) \
                + self.post_feedforward_layernorm_2(routed)
        hidden = hidden + self.post_feedforward_layernorm(fed)
        if per_layer_input is not None:
            gate = F.gelu(self.per_layer_input_gate(hidden), approximate="tanh")
            extra = self.per_layer_projection(gate * per_layer_input)
            hidden = hidden + self.post_per_layer_input_norm(extra)
        return hidden * self.layer_scalar


class Gemma4CausalLM(nn.Module):
    def __init__(self, config: ModelConfig, ops: KernelOps, max_positions: int) -> None:
        super().__init__()
        self.config = config
        spec = config.gemma4
        size = config.hidden_size
        # Given its (uninitialised) weight, the embedding skips its random init.
        self.embed_tokens = nn.Embedding(config.vocab_size, size,
                                         _weight=torch.empty(config.vocab_size, size))
        width = spec.per_layer_input_size
        if width:
            packed = config.num_layers * width
            self.embed_tokens_per_layer = nn.Embedding(
                spec.per_layer_vocab, packed, _weight=torch.empty(spec.per_layer_vocab, packed))
            self.per_layer_model_projection = nn.Linear(size, packed, bias=False)
            self.per_layer_projection_norm = Gemma4Norm(width, config.rms_norm_eps)
        self.layers = nn.ModuleList(Gemma4Layer(config, i, ops, max_positions)
                                    for i in range(config.num_layers))
        self.norm = Gemma4Norm(size, config.rms_norm_eps)
        self.lm_head = nn.Linear(size, config.vocab_size, bias=False)
        self.max_positions = max_positions
        self.kv_index = [spec.cache_index(i) for i in range(config.num_layers)]
        self.tables: dict[int, torch.Tensor] = {}   # per layer: its rope's cos/sin table
        # executor/native_step/gemma4.py's Gemma4NativeStep, set at load where it can run
        # this model: steps of up to its max_tokens run every layer in one C++ call.
        self.native_step = None
        self.longrope_original = None

    def fuse_projections(self) -> None:
        """After loading: q/k/v and gate/up each in one matmul (executor/models/gemma4/
        layers.py), as Folio's other models hold them."""
        for layer in self.layers:
            layer.self_attn.fuse()
            layer.mlp.fuse()

    def init_rotary(self) -> None:
        """One cos/sin table per (rope, head size): sliding and global layers differ."""
        device = self.embed_tokens.weight.device
        made: dict[tuple, torch.Tensor] = {}
        for i, layer in enumerate(self.layers):
            key = (self.config.layer_rope(i), layer.self_attn.head_dim)
            if key not in made:
                made[key] = rotary_cos_sin_cache(key[0], key[1], self.max_positions, device)
            self.tables[i] = made[key]

    def _per_layer_inputs(self, input_ids: torch.Tensor, embedded: torch.Tensor
                          ) -> torch.Tensor | None:
        """[T, layers, width]: (norm(projection) + token slice) / sqrt(2), as transformers."""
        width = self.config.gemma4.per_layer_input_size
        if not width:
            return None
        layers = self.config.num_layers
        table = self.embed_tokens_per_layer.weight
        tokens = self.embed_tokens_per_layer(input_ids) * torch.tensor(width ** 0.5,
                                                                       dtype=table.dtype)
        projected = self.per_layer_model_projection(embedded) * self.config.hidden_size ** -0.5
        projected = self.per_layer_projection_norm(projected.reshape(-1, layers, width))
        return (projected + tokens.reshape(-1, layers, width)) * 2.0 ** -0.5

    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor,
                kv_caches: list[tuple[torch.Tensor, torch.Tensor]], inputs: AttentionInputs,
                long_rope: bool = False) -> torch.Tensor:
        weight = self.embed_tokens.weight
        # Scaled by sqrt(hidden) rounded to the model dtype, as Gemma does.
        hidden = self.embed_tokens(input_ids) * torch.tensor(self.config.hidden_size ** 0.5,
                                                             dtype=weight.dtype)
        per_layer = self._per_layer_inputs(input_ids, hidden)
        # Each distinct table's rows at this step's positions, gathered once for its layers.
        rows = {id(table): table[positions].to(weight.dtype)[:, None, :]
                for table in self.tables.values()}
        native = self.native_step
        if native is not None and len(input_ids) <= native.max_tokens:
            return self.norm(native(rows, hidden, per_layer, kv_caches, inputs))
        for i, layer in enumerate(self.layers):
            hidden = layer(rows[id(self.tables[i])], hidden,
                           None if per_layer is None else per_layer[:, i],
                           kv_caches[self.kv_index[i]], inputs)
        return self.norm(hidden)

    def compute_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        return final_logits(self.lm_head, hidden, self.config.final_softcap)
