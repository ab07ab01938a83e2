"""A model's layers read into kernels/cpu/decode_step.cpp's DecodeStep: per layer its norm
weights, its attention options and its four linears, each as the kind of call its module
makes (DecodeStep's header lists them)."""

from __future__ import annotations

import torch
from torch import nn

from folio.executor.linear import PackedLinear, TiledBf16Linear
from folio.executor.models.decoder import CausalLM, DecoderLayer
from folio.executor.models.layers import Attention, GatedMLP, RMSNorm
from folio.executor.quantization.weight_only_linear import WeightOnlyLinear

# DecodeStep's linear kinds.
TORCH, ONEDNN, WEIGHT_ONLY, BF16_TILES = 0, 1, 2, 3
_LINEARS = (nn.Linear, PackedLinear, WeightOnlyLinear, TiledBf16Linear)


def _linears(layer: DecoderLayer) -> tuple[nn.Module, ...]:
    attn, mlp = layer.self_attn, layer.mlp
    return attn.qkv_proj, attn.o_proj, mlp.gate_up_proj, mlp.down_proj


def _norms(layer: DecoderLayer) -> list[nn.Module]:
    norms = [layer.input_layernorm, layer.post_attention_layernorm]
    if layer.self_attn.q_norm is not None:
        norms += [layer.self_attn.q_norm, layer.self_attn.k_norm]
    return norms


def unsupported_module(model: CausalLM, lora_step=None) -> str | None:
    """Why some module of `model` is not one DecodeStep reproduces, or None. Exact types:
    a subclass or a wrapper may compute something else. `lora_step`: the LoRA registry's
    step; forwards LoRA set for it are allowed (the native step runs only the steps without
    adapter rows, where they compute the base linear)."""
    eps = set()
    for layer in model.layers:
        parts = [(layer, DecoderLayer), (layer.self_attn, Attention), (layer.mlp, GatedMLP)]
        parts += [(norm, RMSNorm) for norm in _norms(layer)]
        reason = (wrong_type_reason(parts)
                  or calls_reason(layer, _linears(layer), lora_step))
        if reason is not None:
            return reason
        eps.update(norm.eps for norm in _norms(layer))
    if len(eps) > 1:
        return "norms with different eps"
    return None


def wrong_type_reason(parts: list[tuple[nn.Module, type]]) -> str | None:
    """The first (module, class) pair whose module is not exactly of that class, as a reason
    (a subclass or a wrapper may compute something else), or None."""
    for module, expected in parts:
        if type(module) is not expected:
            return f"a {type(module).__name__} layer"
    return None


def calls_reason(layer: nn.Module, linears, lora_step=None) -> str | None:
    """Why `layer` computes other than the native step would call it: one of its `linears`
    is no kind the step calls, or a module has a hook or replaced forward; else None."""
    for module in linears:
        reason = linear_reason(module)
        if reason is not None:
            return reason
    return changed_forward_reason(layer, lora_step)


def linear_reason(module: nn.Module) -> str | None:
    """Why `module` is not a linear the native steps call (step_linear.h's kinds), or None."""
    if type(module) not in _LINEARS:
        return f"a {type(module).__name__} linear layer"
    if isinstance(module, WeightOnlyLinear) and not module.native:
        return "quantized linears without the C++ operator"
    return None


def changed_forward_reason(layer: nn.Module, lora_step=None) -> str | None:
    """Why some module of `layer` computes other than its class says (a hook, a forward
    replaced), or None. A forward LoRA set for `lora_step` is allowed."""
    for module in layer.modules():
        if module._forward_hooks or module._forward_pre_hooks:
            return "forward hooks on a layer"
        replaced = module.__dict__.get("forward")   # executor/lora/layers.py sets one
        if replaced is not None and (lora_step is None
                                     or getattr(replaced, "lora_step", None) is not lora_step):
            return "a replaced forward (LoRA)"
    return None


def linear_operands(module: nn.Module) -> tuple[int, list[torch.Tensor], list[int]]:
    """(kind, tensors, config) of DecodeStep.add_linear for one linear module."""
    if isinstance(module, WeightOnlyLinear):
        operands, config = module.native_operands()
        return WEIGHT_ONLY, operands, config
    if isinstance(module, TiledBf16Linear):
        bias = [] if module.bias is None else [module.bias]
        return BF16_TILES, [module.packed_weight, *bias], [module.out_features]
    if isinstance(module, PackedLinear):
        weight, kind = module.packed_weight, ONEDNN
    else:
        weight, kind = module.weight.detach(), TORCH
    bias = [] if module.bias is None else [module.bias.detach()]
    return kind, [weight, *bias], []


def build_decode_step(model: CausalLM) -> torch.ScriptObject:
    """The C++ object holding `model`'s layers (after its weights and cos/sin tables are
    loaded; it keeps references to them, not copies)."""
    first = model.layers[0].self_attn
    native = torch.classes.folio.DecodeStep(
        first.num_heads, first.num_kv_heads, first.head_dim, first.rotary_dim or first.head_dim,
        float(model.layers[0].input_layernorm.eps), float(first.scale), list(model.tables))
    for layer, table in zip(model.layers, model.layer_table):
        attn = layer.self_attn
        native.add_layer([norm.weight.detach() for norm in _norms(layer)], attn.window or 0,
                         float(attn.softcap or 0.0), table)
        for module in _linears(layer):
            native.add_linear(*linear_operands(module))
    return native
