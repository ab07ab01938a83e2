"""A Gemma 4 GGUF file's metadata -> the config.json a Hugging Face checkpoint of its text
model carries (no torch import), undoing what llama.cpp's converter (conversion/gemma.py,
Gemma4Model) wrote:

- the global layers' head size as attention.key_length, the sliding layers' as
  key_length_swa; KV heads as one count, or one a layer (global layers:
  num_global_key_value_heads); both written here per layer (per_layer_config);
- which layers slide, one bool a layer (sliding_window_pattern);
- use_double_wide_mlp as one feed_forward_length a layer, doubled on the KV-shared ones;
- attention_k_eq_v as no attn_v on the global layers (llama.cpp then takes the keys);
- the global layers' proportional rope as rope_freqs.weight: one factor per rotary pair,
  1 for the rotated share and 1e30 (no rotation) past it, the rotary width being the whole
  head (rope.dimension_count); the sliding layers' base as rope.freq_base_swa;
- the MoE block as expert_count / expert_used_count / expert_feed_forward_length.

Every layer is checked to hold the tensors, of the shapes, this config gives it; a file
llama.cpp would read otherwise (KV sharing from other layers, a rope that is not
proportional) is refused by name."""

from __future__ import annotations

from typing import Any

import numpy as np

from folio.executor.models.gemma4.spec import _kv_sources
from folio.executor.quantization.gguf.file import field, float32_decimal
from folio.executor.quantization.gguf.gemma4.names import (
    KV_OWNER, LAYER_NEEDS, MOE_NEEDS, OPTIONAL, PLE_NEEDS, layer_part)

_TORCH_DTYPES = {"F16": "float16", "BF16": "bfloat16"}
_NO_ROTATION = 1e30   # the converter's factor for a pair the proportional rope leaves alone


def gemma4_hf_config(reader: Any, arch: str) -> tuple[dict[str, Any], dict[str, Any]]:
    """(config.json, generation_config.json) of the file's text model."""
    tensors = {tensor.name: tensor for tensor in reader.tensors}

    def need(key: str) -> Any:
        value = field(reader, f"{arch}.{key}")
        if value is None:
            raise ValueError(f"the GGUF metadata lacks {arch}.{key}")
        return value

    layers = need("block_count")
    hidden = need("embedding_length")
    kinds = _layer_types(need("attention.sliding_window_pattern"), arch, layers)
    head_full, head_swa = need("attention.key_length"), need("attention.key_length_swa")
    for key, value in (("attention.value_length", head_full),
                       ("attention.value_length_swa", head_swa)):
        if field(reader, f"{arch}.{key}", value) != value:
            raise ValueError(f"metadata {arch}.{key} differs from its key length: Gemma 4's "
                             "keys and values have one head size")
    kv_heads = _per_layer(need("attention.head_count_kv"), f"{arch}.attention.head_count_kv",
                          layers)
    shared = field(reader, f"{arch}.attention.shared_kv_layers", 0)
    sources = _kv_sources(kinds, shared)
    _check_sharing(sources, kinds, shared, arch)
    ffn = _per_layer(need("feed_forward_length"), f"{arch}.feed_forward_length", layers)
    double = ffn != [ffn[0]] * layers
    if double and ffn != [ffn[0] * (2 if sources[i] != i else 1) for i in range(layers)]:
        raise ValueError(f"metadata {arch}.feed_forward_length must be one width, doubled on "
                         "the KV-shared layers only (use_double_wide_mlp)")
    heads_per_layer = [(kv_heads[i], head_full if kind == "full_attention" else head_swa)
                       for i, kind in enumerate(kinds)]
    k_eq_v = _k_eq_v(tensors, kinds, sources)
    ple = field(reader, f"{arch}.embedding_length_per_layer_input", 0) or 0
    for name in ("per_layer_token_embd.weight", "per_layer_model_proj.weight",
                 "per_layer_proj_norm.weight"):
        if ple and name not in tensors:
            raise ValueError(f"the GGUF file has no {name} (metadata "
                             f"{arch}.embedding_length_per_layer_input is {ple})")
        if not ple and name in tensors:
            raise ValueError(f"GGUF tensor {name!r} has no place: metadata "
                             f"{arch}.embedding_length_per_layer_input is 0")
    moe = "blk.0.ffn_gate_inp.weight" in tensors
    raw = {
        "architectures": ["Gemma4ForCausalLM"],
        "vocab_size": int(tensors["token_embd.weight"].shape[1]),   # innermost first
        "hidden_size": hidden,
        "num_hidden_layers": layers,
        "num_attention_heads": need("attention.head_count"),
        "num_key_value_heads": next((kv for kv, kind in zip(kv_heads, kinds)
                                     if kind == "sliding_attention"), kv_heads[0]),
        "head_dim": head_swa,
        "global_head_dim": head_full,
        "per_layer_config": {str(i): {"num_key_value_heads": kv, "head_dim": size}
                             for i, (kv, size) in enumerate(heads_per_layer)},
        "layer_types": kinds,
        "sliding_window": need("attention.sliding_window"),
        "num_kv_shared_layers": shared,
        "intermediate_size": ffn[0],
        "use_double_wide_mlp": double,
        "attention_k_eq_v": k_eq_v,
        "rms_norm_eps": float32_decimal(need("attention.layer_norm_rms_epsilon")),
        "max_position_embeddings": need("context_length"),
        "rope_parameters": _rope(reader, arch, tensors, head_full, head_swa),
        "tie_word_embeddings": "output.weight" not in tensors,
        "attention_bias": False,
        "hidden_size_per_layer_input": ple,
        "vocab_size_per_layer_input": (int(tensors["per_layer_token_embd.weight"].shape[1])
                                       if ple else 0),
        "final_logit_softcapping": (None if field(reader, f"{arch}.final_logit_softcapping")
                                    is None else float32_decimal(
                                        need("final_logit_softcapping"))),
        "enable_moe_block": moe,
        "torch_dtype": _TORCH_DTYPES.get(tensors["token_embd.weight"].tensor_type.name,
                                         "float32"),
    }
    if moe:
        expert_width = need("expert_feed_forward_length")
        if isinstance(expert_width, list):
            if len(set(expert_width)) != 1:
                raise ValueError(f"metadata {arch}.expert_feed_forward_length differs "
                                 "between layers; Folio's Gemma 4 has one expert width")
            expert_width = expert_width[0]
        raw.update(num_experts=need("expert_count"), top_k_experts=need("expert_used_count"),
                   moe_intermediate_size=expert_width)
    _check_layers(tensors, raw, heads_per_layer, sources, ffn, arch)
    eos = [field(reader, f"tokenizer.ggml.{key}_token_id") for key in ("eos", "eot")]
    generation = {"eos_token_id": list(dict.fromkeys(int(t) for t in eos if t is not None))}
    return raw, generation


def _per_layer(value: Any, key: str, layers: int) -> list[int]:
    values = list(value) if isinstance(value, list) else [value] * layers
    if len(values) != layers or not all(isinstance(v, int) and v >= 1 for v in values):
        raise ValueError(f"metadata {key} must be a positive count, or one a layer "
                         f"({layers})")
    return values


def _layer_types(pattern: Any, arch: str, layers: int) -> list[str]:
    key = f"{arch}.attention.sliding_window_pattern"
    if not isinstance(pattern, list) or len(pattern) != layers:
        raise ValueError(f"metadata {key} must list {layers} bools (one a layer)")
    if pattern[-1]:   # transformers makes the last layer global whatever the config says
        raise ValueError(f"metadata {key}: the last layer slides, but Gemma 4's last "
                         "layer is global")
    return ["sliding_attention" if slides else "full_attention" for slides in pattern]


def _check_sharing(sources: tuple[int, ...], kinds: list[str], shared: int,
                   arch: str) -> None:
    """llama.cpp's KV-shared layers read the last kept layer (global) or the one before it
    (sliding); transformers' the last kept layer of their kind. Served where they agree."""
    first = len(kinds) - shared
    for layer in range(first, len(kinds)):
        llama_cpp = first - (2 if kinds[layer] == "sliding_attention" else 1)
        if sources[layer] != llama_cpp:
            raise ValueError(f"metadata {arch}.attention.shared_kv_layers ({shared}): "
                             f"layer {layer} reads layer {sources[layer]}'s cache in "
                             f"transformers but layer {llama_cpp}'s in llama.cpp")


def _k_eq_v(tensors: dict[str, Any], kinds: list[str], sources: tuple[int, ...]) -> bool:
    """attention_k_eq_v: no attn_v on any global layer that keeps a cache (then on all of
    them), every sliding one having its own."""
    owners = [i for i in range(len(kinds)) if sources[i] == i]
    without = {i for i in owners if f"blk.{i}.attn_v.weight" not in tensors}
    globals_ = {i for i in owners if kinds[i] == "full_attention"}
    if without and without != globals_:
        odd = sorted(without ^ globals_)[0]
        raise ValueError(f"blk.{odd}.attn_v.weight: Gemma 4's values are the keys' "
                         "projection on every global layer (attention_k_eq_v) or none")
    return bool(without)


def _rope(reader: Any, arch: str, tensors: dict[str, Any], head_full: int,
          head_swa: int) -> dict[str, Any]:
    scaling = field(reader, f"{arch}.rope.scaling.type")
    if scaling not in (None, "none"):
        raise ValueError(f"GGUF rope scaling {scaling!r} is not supported for {arch}")
    for key, width in (("rope.dimension_count", head_full),
                       ("rope.dimension_count_swa", head_swa)):
        if field(reader, f"{arch}.{key}", width) != width:
            raise ValueError(f"metadata {arch}.{key} must be the head size ({width}): "
                             "Folio's Gemma 4 rotates whole heads, the global ones "
                             "proportionally")
    theta = float32_decimal(field(reader, f"{arch}.rope.freq_base", 10000.0))
    swa = field(reader, f"{arch}.rope.freq_base_swa")
    tensor = tensors.get("rope_freqs.weight")
    if tensor is None:
        raise ValueError("the GGUF file has no rope_freqs.weight (the global layers' "
                         "proportional rope)")
    factors = np.asarray(tensor.data, dtype=np.float32).reshape(-1)
    if tensor.tensor_type.name != "F32" or factors.shape != (head_full // 2,):
        raise ValueError(f"rope_freqs.weight must be {head_full // 2} F32 factors (one per "
                         "rotary pair of a global head)")
    rotated = int((factors == 1.0).sum())
    expected = np.array([1.0] * rotated + [_NO_ROTATION] * (len(factors) - rotated),
                        dtype=np.float32)
    if rotated == 0 or not np.array_equal(factors, expected):
        raise ValueError("rope_freqs.weight is not a proportional rope (factors 1, then "
                         "1e30 for the pairs left unrotated)")
    return {"full_attention": {"rope_type": "proportional", "rope_theta": theta,
                               "partial_rotary_factor": 2 * rotated / head_full},
            "sliding_attention": {"rope_type": "default",
                                  "rope_theta": theta if swa is None
                                  else float32_decimal(swa)}}


def _check_layers(tensors: dict[str, Any], raw: dict[str, Any],
                  heads: list[tuple[int, int]], sources: tuple[int, ...], ffn: list[int],
                  arch: str) -> None:
    """Each layer holds what its kind needs, every tensor the shape the config gives it
    (GGUF shapes innermost first)."""
    hidden, q_heads = raw["hidden_size"], raw["num_attention_heads"]
    ple, layers = raw["hidden_size_per_layer_input"], raw["num_hidden_layers"]
    vocab = raw["vocab_size"]
    shapes = {"token_embd.weight": (hidden, vocab), "output.weight": (hidden, vocab),
              "output_norm.weight": (hidden,)}
    if ple:
        shapes.update({"per_layer_token_embd.weight": (ple * layers,
                                                       raw["vocab_size_per_layer_input"]),
                       "per_layer_model_proj.weight": (hidden, ple * layers),
                       "per_layer_proj_norm.weight": (ple,)})
    held: dict[int, set[str]] = {}
    for name in tensors:
        part = layer_part(name)
        if part is not None:
            held.setdefault(part[0], set()).add(part[1])
    for layer in range(layers):
        kv, size = heads[layer]
        if q_heads % kv:
            raise ValueError(f"metadata {arch}.attention.head_count ({q_heads}) is not a "
                             f"multiple of layer {layer}'s KV heads ({kv})")
        needs = list(LAYER_NEEDS)
        if sources[layer] == layer:
            needs += KV_OWNER
        needs += PLE_NEEDS if ple else ()
        needs += MOE_NEEDS if raw["enable_moe_block"] else ()
        for need in needs:
            if need not in held.get(layer, set()):
                raise ValueError(f"the GGUF file has no blk.{layer}.{need}")
        extra = held.get(layer, set()) - set(needs) - set(OPTIONAL)
        if extra:
            raise ValueError(f"blk.{layer}.{sorted(extra)[0]} has no place in Folio's "
                             f"{arch} (its layer kinds: PLE {bool(ple)}, MoE "
                             f"{raw['enable_moe_block']})")
        per = {"attn_norm.weight": (hidden,), "post_attention_norm.weight": (hidden,),
               "ffn_norm.weight": (hidden,), "post_ffw_norm.weight": (hidden,),
               "attn_q.weight": (hidden, q_heads * size),
               "attn_k.weight": (hidden, kv * size), "attn_v.weight": (hidden, kv * size),
               "attn_output.weight": (q_heads * size, hidden),
               "attn_q_norm.weight": (size,), "attn_k_norm.weight": (size,),
               "ffn_gate.weight": (hidden, ffn[layer]), "ffn_up.weight": (hidden, ffn[layer]),
               "ffn_down.weight": (ffn[layer], hidden), "layer_output_scale.weight": (1,),
               "inp_gate.weight": (hidden, ple), "proj.weight": (ple, hidden),
               "post_norm.weight": (hidden,)}
        if raw["enable_moe_block"]:
            experts, width = raw["num_experts"], raw["moe_intermediate_size"]
            per.update({"ffn_gate_inp.weight": (hidden, experts),
                        "ffn_gate_inp.scale": (hidden,), "ffn_down_exps.scale": (experts,),
                        "ffn_gate_up_exps.weight": (hidden, 2 * width, experts),
                        "ffn_down_exps.weight": (width, hidden, experts),
                        "pre_ffw_norm_2.weight": (hidden,), "post_ffw_norm_1.weight": (hidden,),
                        "post_ffw_norm_2.weight": (hidden,)})
        shapes.update({f"blk.{layer}.{name}": shape for name, shape in per.items()})
    for name, tensor in tensors.items():
        expected = shapes.get(name)
        dims = tuple(int(d) for d in tensor.shape)
        if expected is not None and dims != expected:
            raise ValueError(f"tensor {name} has shape {list(dims)}; the metadata gives "
                             f"{list(expected)}")
    if "output_norm.weight" not in tensors:
        raise ValueError("the GGUF file has no output_norm.weight")
