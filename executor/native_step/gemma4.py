"""The native step of Gemma 4's dense text decoder (executor/models/gemma4/): a
Gemma4CausalLM's layers read into kernels/cpu/gemma4_step.cpp's Gemma4Step, which runs every
layer of a step of up to max_tokens tokens in one C++ call, bit-identical to the Python
layers with the CPU kernel set. The embeddings, the per-layer inputs and the rope rows stay
in Gemma4CausalLM.forward (once a step, shared by every layer)."""

from __future__ import annotations

import torch
from torch import nn

from folio.executor.models.gemma4.layers import Gemma4Attention, Gemma4Mlp, Gemma4Norm
from folio.executor.models.gemma4.model import Gemma4CausalLM, Gemma4Layer
from folio.executor.native_step.layers import (calls_reason, linear_operands,
                                               wrong_type_reason)
from folio.executor.ops import AttentionInputs


def _has_ple(model: Gemma4CausalLM) -> bool:
    return bool(model.config.gemma4.per_layer_input_size)


def _linears(layer: Gemma4Layer, ple: bool) -> tuple[nn.Module | None, ...]:
    """The layer's linears in Gemma4Step.add_linear's order."""
    attn, mlp = layer.self_attn, layer.mlp
    first = attn.qkv_proj if attn.owns_cache else attn.q_proj
    extra = (layer.per_layer_input_gate, layer.per_layer_projection) if ple else ()
    return (first, attn.o_proj, mlp.gate_up_proj, mlp.down_proj, *extra)


def _norms(layer: Gemma4Layer, ple: bool) -> list[Gemma4Norm]:
    """The layer's weighted norms in Gemma4Step.add_layer's order."""
    attn = layer.self_attn
    norms = [layer.input_layernorm, layer.post_attention_layernorm,
             layer.pre_feedforward_layernorm, layer.post_feedforward_layernorm, attn.q_norm]
    if attn.owns_cache:
        norms.append(attn.k_norm)
    if ple:
        norms.append(layer.post_per_layer_input_norm)
    return norms


def gemma4_layers_reason(model: Gemma4CausalLM) -> str | None:
    """Why some part of `model` is not one Gemma4Step reproduces, or None. Exact types: a
    subclass or a wrapper may compute something else."""
    if model.config.gemma4.moe is not None:
        # ops.fused_moe of the CPU kernel set is kernels/moe_cpu.py's Python (no C++ operator
        # to call from the step), and a callback per layer would give back what it saves.
        return "Gemma 4's MoE block (its CPU experts are Python)"
    if type(model) is not Gemma4CausalLM:
        return f"a {type(model).__name__} model"
    ple = _has_ple(model)
    eps = set()
    for layer in model.layers:
        attn = layer.self_attn
        parts = [(layer, Gemma4Layer), (attn, Gemma4Attention), (layer.mlp, Gemma4Mlp)]
        parts += [(norm, Gemma4Norm) for norm in _norms(layer, ple)]
        if attn.owns_cache:
            parts.append((attn.v_norm, Gemma4Norm))
        reason = wrong_type_reason(parts)
        if reason is not None:
            return reason
        if any(norm.weight is None for norm in _norms(layer, ple)) or \
                (attn.owns_cache and attn.v_norm.weight is not None):
            return "a Gemma 4 norm with other weights"
        if (attn.owns_cache and attn.qkv_proj is None) or layer.mlp.gate_up_proj is None:
            return "unfused Gemma 4 projections"
        reason = calls_reason(layer, _linears(layer, ple))
        if reason is not None:
            return reason
        eps.update(norm.eps for norm in _norms(layer, ple))
        if attn.owns_cache:
            eps.add(attn.v_norm.eps)
    if len(eps) > 1:
        return "norms with different eps"
    return None


def build_gemma4_step(model: Gemma4CausalLM) -> tuple[torch.ScriptObject, list[torch.Tensor]]:
    """The C++ object holding `model`'s layers (after its weights and cos/sin tables are
    loaded; it keeps references to them, not copies), and the distinct tables in the order
    its layers index them."""
    ple = _has_ple(model)
    tables: list[torch.Tensor] = []
    for i in range(len(model.layers)):
        if not any(t is model.tables[i] for t in tables):
            tables.append(model.tables[i])
    first = model.layers[0].self_attn
    native = torch.classes.folio.Gemma4Step(first.num_heads,
                                            float(model.layers[0].input_layernorm.eps),
                                            float(first.scale), ple)
    for i, layer in enumerate(model.layers):
        attn = layer.self_attn
        table = next(j for j, t in enumerate(tables) if t is model.tables[i])
        native.add_layer([norm.weight.detach() for norm in _norms(layer, ple)],
                         layer.layer_scalar.detach(), attn.num_kv_heads, attn.head_dim,
                         model.kv_index[i], attn.owns_cache, attn.window or 0, table)
        for module in _linears(layer, ple):
            native.add_linear(*linear_operands(module))
    return native, tables


class Gemma4NativeStep:
    """Runs every layer of a step of up to `max_tokens` tokens in one C++ call; returns the
    hidden states the layer loop leaves (before the final norm), bit for bit."""

    def __init__(self, model: Gemma4CausalLM, max_tokens: int) -> None:
        self.max_tokens = max_tokens
        self._native, self._tables = build_gemma4_step(model)

    def __call__(self, rows: dict[int, torch.Tensor], hidden: torch.Tensor,
                 per_layer: torch.Tensor | None,
                 kv_caches: list[tuple[torch.Tensor, torch.Tensor]], inputs: AttentionInputs
                 ) -> torch.Tensor:
        """rows: Gemma4CausalLM.forward's, by id() of each table."""
        return self._native.run([rows[id(table)] for table in self._tables], hidden,
                                per_layer, [k for k, _ in kv_caches],
                                [v for _, v in kv_caches], inputs.slot_mapping,
                                inputs.block_tables, inputs.seq_lens, inputs.query_start_loc)
