"""The native decode step of the hybrid models (Qwen3.5, LFM2: executor/models/hybrid/):
a HybridCausalLM's layers read into kernels/cpu/hybrid_step.cpp's HybridStep, which runs a
decode-only step (one token per sequence, no drafts, no checkpoint) through every layer in
one C++ call, bit-identical to the Python layers with the CPU kernel set."""

from __future__ import annotations

import torch
from torch import nn

from folio.executor.models.hybrid.layers import (DepthwiseConv, GatedDeltaNet, GatedMlp,
                                                 GatedNorm, HybridAttention, Norm, ShortConv)
from folio.executor.models.hybrid.model import HybridCausalLM, HybridLayer
from folio.executor.models.hybrid.state_pool import StatePool, StepStates
from folio.executor.native_step.layers import (calls_reason, linear_operands,
                                               wrong_type_reason)
from folio.executor.ops import AttentionInputs

# HybridStep's layer kinds.
ATTENTION, GATED_DELTA, SHORT_CONV = 0, 1, 2
_MIXERS = {HybridAttention: ATTENTION, GatedDeltaNet: GATED_DELTA, ShortConv: SHORT_CONV}


def _mixer_linears(mixer: nn.Module) -> tuple[nn.Module, ...]:
    """The mixer's linears in HybridStep.add_linear's order."""
    if isinstance(mixer, HybridAttention):
        out = mixer.o_proj if mixer.gated else mixer.out_proj
        return mixer.q_proj, mixer.k_proj, mixer.v_proj, out
    if isinstance(mixer, GatedDeltaNet):
        return (mixer.in_proj_qkv, mixer.in_proj_z, mixer.in_proj_b, mixer.in_proj_a,
                mixer.out_proj)
    return mixer.in_proj, mixer.out_proj


def _linears(layer: HybridLayer) -> tuple[nn.Module, ...]:
    ffn = layer.ffn
    return (*_mixer_linears(layer.mixer), *(ffn._modules[name] for name in ffn.names))


def _norms(layer: HybridLayer) -> list[nn.Module]:
    """Every norm of the layer: its two, the attention's q/k norms, DeltaNet's gated one."""
    norms = list(layer.norms)
    mixer = layer.mixer
    if isinstance(mixer, HybridAttention):
        norms += ([mixer.q_norm, mixer.k_norm] if mixer.gated
                  else [mixer.q_layernorm, mixer.k_layernorm])
    if isinstance(mixer, GatedDeltaNet):
        norms.append(mixer.norm)
    return norms


def hybrid_layers_reason(model: HybridCausalLM) -> str | None:
    """Why some part of `model` is not one HybridStep reproduces, or None. Exact types: a
    subclass or a wrapper may compute something else."""
    if model.config.moe is not None:
        return "MoE layers"
    eps, offsets = set(), set()
    for layer in model.layers:
        mixer = layer.mixer
        if type(mixer) not in _MIXERS:
            return f"a {type(mixer).__name__} layer"
        parts = [(layer, HybridLayer), (layer.ffn, GatedMlp)]
        parts += [(norm, GatedNorm if isinstance(norm, GatedNorm) else Norm)
                  for norm in _norms(layer)]
        if not isinstance(mixer, HybridAttention):
            conv = mixer.conv1d if isinstance(mixer, GatedDeltaNet) else mixer.conv
            parts.append((conv, DepthwiseConv))
        reason = wrong_type_reason(parts)
        if reason is not None:
            return reason
        if not isinstance(mixer, HybridAttention) and not mixer.native:
            return "the recurrent layers' torch decode steps"
        reason = calls_reason(layer, _linears(layer))
        if reason is not None:
            return reason
        eps.update(norm.eps for norm in _norms(layer))
        offsets.update(norm.offset for norm in _norms(layer)
                       if type(norm) is Norm and norm.zero_centred)
    if len(eps) > 1:
        return "norms with different eps"
    if len(offsets) > 1:
        return "zero-centred norms with different offsets"
    return None


def _layer_tensors(mixer: nn.Module) -> list[torch.Tensor]:
    """HybridStep.add_layer's tensors for the mixer's kind."""
    if isinstance(mixer, HybridAttention):
        norms = (mixer.q_norm, mixer.k_norm) if mixer.gated \
            else (mixer.q_layernorm, mixer.k_layernorm)
        return [norm.weight.detach() for norm in norms]
    if isinstance(mixer, GatedDeltaNet):
        return [mixer.conv1d.weight.detach(), mixer.A_log.detach(), mixer.dt_bias.detach(),
                mixer.norm.weight.detach()]
    bias = [] if mixer.conv.bias is None else [mixer.conv.bias.detach()]
    return [mixer.conv.weight.detach(), *bias]


def build_hybrid_step(model: HybridCausalLM) -> torch.ScriptObject:
    """The C++ object holding `model`'s layers (after its weights and cos/sin table are
    loaded; it keeps references to them, not copies)."""
    config, spec = model.config, model.config.hybrid
    qwen = spec.family == "qwen3_5"
    delta = [spec.num_k_heads, spec.num_v_heads, spec.k_head_dim, spec.v_head_dim] \
        if qwen else []
    native = torch.classes.folio.HybridStep(
        qwen, config.num_heads, config.num_kv_heads, config.head_dim,
        config.rotary_dim or config.head_dim, float(model.layers[0].norms[0].eps),
        float(model.layers[0].norms[0].offset), float(config.head_dim ** -0.5),
        model.cos_sin, delta)
    for layer in model.layers:
        native.add_layer(_MIXERS[type(layer.mixer)],
                         [norm.weight.detach() for norm in layer.norms],
                         _layer_tensors(layer.mixer))
        for module in _linears(layer):
            native.add_linear(*linear_operands(module))
    return native


class HybridNativeStep:
    """Runs every layer of a decode-only step of up to `max_tokens` sequences in one C++
    call, on the state pool in place; returns the hidden states the layer loop leaves."""

    def __init__(self, model: HybridCausalLM, max_tokens: int) -> None:
        self.max_tokens = max_tokens
        self._native = build_hybrid_step(model)
        # The pool's tensors in HybridStep.run's order: by layer, recurrent / DeltaNet ones.
        self._recurrent = [i for i, layer in enumerate(model.layers) if not layer.is_attention]
        self._delta = [i for i, layer in enumerate(model.layers)
                       if isinstance(layer.mixer, GatedDeltaNet)]

    def __call__(self, positions: torch.Tensor, hidden: torch.Tensor,
                 kv_caches: list[tuple[torch.Tensor, torch.Tensor]], inputs: AttentionInputs,
                 pool: StatePool, states: StepStates) -> torch.Tensor:
        return self._native.run(positions, hidden, [k for k, _ in kv_caches],
                                [v for _, v in kv_caches], inputs.slot_mapping,
                                inputs.block_tables, inputs.seq_lens, inputs.query_start_loc,
                                [pool.conv[i] for i in self._recurrent],
                                [pool.delta[i] for i in self._delta], states.slots,
                                states.fresh)
