"""The one start-up line that names a model and what sets it apart."""

from __future__ import annotations

import math

from folio.executor.model_config import ModelConfig


def describe(config: ModelConfig) -> str:
    """The architecture and what sets it apart, in one line for the start-up log."""
    heads, kv = config.num_heads, config.num_kv_heads
    kind = "MHA" if heads == kv else "MQA" if kv == 1 else "GQA"
    parts = [f"{config.num_layers} layers", f"{kind} {heads}/{kv}",
             f"head_dim {config.head_dim}"]
    if config.qk_norm:
        parts.append("q/k norm")
    windowed = [w for w in config.layer_windows if w]
    if windowed:
        sizes = "/".join(str(w) for w in sorted(set(windowed)))
        parts.append(f"sliding window {sizes} on {len(windowed)} of {config.num_layers} "
                     "layers")
    rope = f"rope {_num(config.rope.theta)}"
    if config.local_rope is not None and windowed:
        rope += f"/{_num(config.local_rope.theta)}"
    types = dict.fromkeys(r.rope_type for r in (config.rope, config.local_rope) if r is not None)
    types.pop("default", None)
    if types:
        rope += " " + "/".join(types)
    if config.rotary_dim:
        rope += f" on {config.rotary_dim} of {config.head_dim} dims"
    if config.rope_layers:
        rope += f" on {sum(config.rope_layers)} of {config.num_layers} layers"
    parts.append(rope)
    if config.norms == "post":
        parts.append("norms after each sublayer")
    if config.attention_sinks:
        parts.append("attention sinks")
    if config.moe is not None:
        moe = config.moe
        sparse = sum(moe.sparse_layers)
        parts.append(f"MoE {moe.num_experts} experts top-{moe.top_k}"
                     f"{' sigmoid-scored' if moe.scoring == 'sigmoid' else ''}"
                     f"{' with expert bias' if moe.expert_bias else ''}"
                     f"{' renormalised' if moe.renormalize else ''}"
                     f"{f' x{moe.routed_scaling:g}' if moe.routed_scaling != 1.0 else ''}"
                     f"{' + a gated shared expert' if moe.shared_expert_size else ''}"
                     + ("" if sparse == config.num_layers else
                        f" on {sparse} of {config.num_layers} layers"))
    if config.gemma4 is not None:
        parts.extend(_gemma4(config))
    if config.attn_softcap:
        parts.append(f"attention softcap {config.attn_softcap:g}")
    if config.final_softcap:
        parts.append(f"final softcap {config.final_softcap:g}")
    return f"{config.architecture}: {', '.join(parts)}"


def _gemma4(config: ModelConfig) -> list[str]:
    spec = config.gemma4
    shapes = dict.fromkeys(spec.layer_heads)
    parts = ["KV heads/head_dim " + ", ".join(f"{kv}/{dim}" for kv, dim in shapes)]
    shared = config.num_layers - len(spec.cache_layers)
    if shared:
        parts.append(f"{shared} of {config.num_layers} layers reuse an earlier layer's KV")
    if any(spec.k_eq_v):
        parts.append(f"values = keys' projection on {sum(spec.k_eq_v)} layers")
    if spec.per_layer_input_size:
        parts.append(f"per-layer inputs {spec.per_layer_input_size} wide")
    return parts


def _num(value: float) -> str:
    exponent = round(math.log10(value)) if value > 0 else 0
    if value >= 1e4 and value == 10 ** exponent:
        return f"1e{exponent}"
    return f"{value:g}"
