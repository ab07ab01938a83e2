"""config.json -> ModelConfig for every supported architecture (no torch import here: the
command line's checks read configs before any process starts).

Each architecture differs from Llama in a few switches (executor/models/architectures.py);
everything else is read the same way. Where transformers derives a value (windowed layers,
the longrope attention factor, Gemma's layer pattern), it is derived here the same way.
"""

from __future__ import annotations

import json
import math
from dataclasses import replace
from pathlib import Path
from typing import Any

from folio.executor.quantization.gguf.config import gguf_hf_config
from folio.executor.quantization.gguf.file import is_gguf, open_gguf
from folio.executor.model_config import ModelConfig, MoeConfig, RopeConfig
from folio.executor.quantization.prequantized_config import read_quantization_config
from folio.shared.pooling.task import base_model_architecture
from folio.executor.models.gemma4.spec import layer_types as gemma4_layer_types
from folio.executor.models.gemma4.spec import parse_gemma4
from folio.executor.models.hybrid.spec import lfm2_intermediate_size, parse_hybrid
from folio.executor.models.hybrid.moe_config import active_width, hybrid_moe, text_model_raw
from folio.executor.models.architectures import (ARCHITECTURES, SUPPORTED_ARCHITECTURES,
                                                 Architecture)


# Families people ask for whose needs Folio does not meet yet (docs/models.md): refused by
# what is missing rather than as an unknown name.
_NOT_YET: dict[str, str] = {}
# Multimodal checkpoints served as their text model: its config is nested under
# text_config, its weights under model.language_model. (the loader skips the towers).
_TEXT_PART = {"Gemma4ForConditionalGeneration": "Gemma4ForCausalLM"}

_ACTIVATIONS = {"silu": "silu", "gelu_pytorch_tanh": "gelu_tanh"}


def read_model_config(model_dir: str | Path) -> ModelConfig:
    """The model directory's config.json, with generation_config.json's eos_token_id; or a
    GGUF file's metadata."""
    if is_gguf(model_dir):
        return parse_model_config(*gguf_hf_config(open_gguf(model_dir)))
    model_dir = Path(model_dir)
    config_path = model_dir / "config.json"
    if not config_path.is_file():
        raise FileNotFoundError(f"no config.json in model directory {model_dir}")
    raw = json.loads(config_path.read_text(encoding="utf-8"))
    generation = model_dir / "generation_config.json"
    gen = json.loads(generation.read_text(encoding="utf-8")) if generation.is_file() else {}
    return parse_model_config(raw, gen)


def parse_model_config(raw: dict[str, Any], generation: dict[str, Any] | None = None
                       ) -> ModelConfig:
    """A parsed config.json (and generation_config.json) -> ModelConfig; ValueError names
    what Folio cannot serve."""
    generation = generation or {}
    raw = text_model_raw(raw)   # a vision-language wrapper's text model (Qwen3.5)
    architectures = raw.get("architectures") or []
    # A base model class (Qwen3Model) is its decoder without the LM head (shared/pooling/).
    name = base_model_architecture(architectures[0], ARCHITECTURES) if architectures \
        else "<none>"
    if name in _TEXT_PART and isinstance(raw.get("text_config"), dict):
        text = raw["text_config"]
        raw = {**text, "architectures": [_TEXT_PART[name]],   # the outer config ties
               "tie_word_embeddings": raw.get("tie_word_embeddings",
                                              text.get("tie_word_embeddings", True))}
        name = _TEXT_PART[name]
    if name in _NOT_YET:
        raise ValueError(f"{name} is not supported yet: Folio lacks {_NOT_YET[name]}")
    if name not in ARCHITECTURES:
        raise ValueError(f"unsupported architecture {name!r}; Folio supports "
                         f"{', '.join(SUPPORTED_ARCHITECTURES)}")
    arch = ARCHITECTURES[name]
    raw = {**dict(arch.defaults), **raw}
    if arch.moe == "qwen3_5_moe" and "intermediate_size" not in raw:   # no dense MLP
        raw["intermediate_size"] = active_width(raw)
    act_key = "hidden_activation" if arch.gemma else "hidden_act"
    act = raw.get(act_key) or ("gelu_pytorch_tanh" if arch.gemma else "silu")
    if act not in _ACTIVATIONS:
        raise ValueError(f"unsupported {act_key} {act!r} for {name}; Folio supports "
                         f"{', '.join(_ACTIVATIONS)}")
    num_heads = raw["num_attention_heads"]
    num_kv_heads = raw.get("num_key_value_heads") or num_heads
    if num_heads % num_kv_heads:
        raise ValueError(f"num_attention_heads ({num_heads}) must be a multiple of "
                         f"num_key_value_heads ({num_kv_heads})")
    num_layers = raw["num_hidden_layers"]
    head_dim = raw.get("head_dim") or arch.head_dim or raw["hidden_size"] // num_heads
    bias = bool(raw.get("attention_bias", False))
    windows = _layer_windows(raw, arch, num_layers)
    rope, local_rope, rotary_dim = _ropes(raw, arch, head_dim)
    eos = generation.get("eos_token_id", raw.get("eos_token_id"))
    scalar = raw.get("query_pre_attn_scalar", 256) if arch.gemma else None
    config = ModelConfig(
        architecture=name,
        vocab_size=raw["vocab_size"],
        hidden_size=raw["hidden_size"],
        num_layers=num_layers,
        num_heads=num_heads,
        num_kv_heads=num_kv_heads,
        head_dim=head_dim,
        intermediate_size=raw["intermediate_size"],
        rms_norm_eps=raw.get("rms_norm_eps", 1e-6),
        max_position_embeddings=raw.get("max_position_embeddings", 2048),
        tie_word_embeddings=bool(raw.get("tie_word_embeddings", arch.gemma)),
        qkv_bias=bias if arch.qkv_bias is None else arch.qkv_bias,
        o_bias=bias if arch.o_bias is None else arch.o_bias,
        mlp_bias=bool(raw.get("mlp_bias", False)),
        rope=rope,
        torch_dtype=str(raw.get("dtype") or raw.get("torch_dtype") or "float32"),
        sliding_window=max((w for w in windows if w), default=None),
        eos_token_ids=_as_id_tuple(eos),
        hidden_act=_ACTIVATIONS[act],
        qk_norm=arch.qk_norm,
        gemma=arch.gemma,
        query_scale=None if scalar is None else float(scalar) ** -0.5,
        attn_softcap=_positive(raw, "attn_logit_softcapping", arch.softcaps[0])
        if arch.gemma else None,
        final_softcap=_positive(raw, "final_logit_softcapping", arch.softcaps[1])
        if arch.gemma else None,
        layer_windows=windows if any(windows) else (),
        local_rope=local_rope,
        rotary_dim=rotary_dim,
        moe=_moe(raw, arch, num_layers),
        prequantized=None if _mxfp4_experts(raw, arch) else read_quantization_config(raw),
        rope_layers=_rope_layers(raw, arch, num_layers),
        norms=arch.norms,
        qk_norm_whole=arch.qk_norm_whole,
        attention_sinks=arch.sinks,
    )
    if arch.gemma4:
        return _with_gemma4(config, raw, head_dim, num_kv_heads)
    return _with_hybrid(config, raw, arch) if arch.hybrid else config


def _with_gemma4(config: ModelConfig, raw: dict[str, Any], head_dim: int,
                 num_kv_heads: int) -> ModelConfig:
    """Gemma 4's layer table (executor/models/gemma4/spec.py), its windows as transformers
    sets them (the last layer global), and no query scale (q and k are RMS-normed)."""
    types = gemma4_layer_types(raw, config.num_layers)
    window = raw["sliding_window"]
    windows = tuple(window if kind == "sliding_attention" else None for kind in types)
    return replace(config, query_scale=1.0, layer_windows=windows, sliding_window=window,
                   gemma4=parse_gemma4(raw, types, head_dim, num_kv_heads))


def _with_hybrid(config: ModelConfig, raw: dict[str, Any], arch: Architecture) -> ModelConfig:
    """A hybrid's recurrent layers (executor/models/hybrid/spec.py), and LFM2's own names."""
    spec = parse_hybrid(arch.hybrid, raw, config.num_layers)
    if arch.hybrid != "lfm2":
        return replace(config, hybrid=spec)
    # LFM2-MoE's dense layers take intermediate_size as it is.
    return replace(config, hybrid=spec, rms_norm_eps=float(raw.get("norm_eps", 1e-5)),
                   intermediate_size=lfm2_intermediate_size(raw) if arch.moe is None
                   else config.intermediate_size)


def _mxfp4_experts(raw: dict[str, Any], arch: Architecture) -> bool:
    """gpt-oss's MXFP4 experts: dequantized at load (executor/models/gpt_oss/mxfp4.py), so
    no pre-quantized scheme applies to the rest of the model."""
    quant = raw.get("quantization_config")
    if not isinstance(quant, dict) or str(quant.get("quant_method", "")).lower() != "mxfp4":
        return False
    if not arch.mxfp4_experts:
        raise ValueError("pre-quantized checkpoint: quant_method 'mxfp4' is supported for "
                         "GptOssForCausalLM's experts only")
    return True


def _rope_layers(raw: dict[str, Any], arch: Architecture, num_layers: int) -> tuple[bool, ...]:
    """Per layer, whether rotary turns its q and k; () when every layer's does."""
    if not arch.no_rope_layers:
        return ()
    flags = raw.get("no_rope_layers")
    if flags is None:   # transformers' default: every no_rope_layer_interval-th layer is off
        interval = raw.get("no_rope_layer_interval", 4)
        flags = [int((i + 1) % interval != 0) for i in range(num_layers)]
    if len(flags) != num_layers:
        raise ValueError(f"no_rope_layers has {len(flags)} entries for {num_layers} layers")
    return () if all(flags) else tuple(bool(flag) for flag in flags)


def _layer_windows(raw: dict[str, Any], arch: Architecture, num_layers: int
                   ) -> tuple[int | None, ...]:
    window = raw.get("sliding_window", arch.window)
    if not window or arch.windows == "none":
        return ()
    if arch.windows == "qwen" and not raw.get("use_sliding_window", False):
        return ()
    types = raw.get("layer_types")
    if types:
        if len(types) != num_layers:
            raise ValueError(f"layer_types has {len(types)} entries for {num_layers} layers")
        return tuple(window if kind == "sliding_attention" else None for kind in types)
    if arch.windows == "gemma2":      # even layers local, odd layers global
        return tuple(window if i % 2 == 0 else None for i in range(num_layers))
    if arch.windows == "olmo3":       # without layer_types: every 4th layer global
        return tuple(window if (i + 1) % 4 else None for i in range(num_layers))
    if arch.windows == "gemma3":      # every pattern-th layer global
        pattern = raw.get("sliding_window_pattern") or raw.get("_sliding_window_pattern") or 6
        return tuple(window if (i + 1) % pattern else None for i in range(num_layers))
    if arch.windows == "qwen":        # the first max_window_layers layers are global
        first = raw.get("max_window_layers", num_layers)
        return tuple(window if i >= first else None for i in range(num_layers))
    return (window,) * num_layers


def _ropes(raw: dict[str, Any], arch: Architecture, head_dim: int
           ) -> tuple[RopeConfig, RopeConfig | None, int | None]:
    # transformers >= 5 writes "rope_parameters" (theta inside; Gemma 3: one per layer
    # type); older configs write "rope_theta" plus an optional "rope_scaling".
    params = dict(raw.get("rope_parameters") or raw.get("rope_scaling") or {})
    local = None
    if arch.scaling_on_full_only and "full_attention" not in params and params:
        # OLMo 3: a flat rope_scaling scales the global layers; the sliding ones keep the
        # plain rope of the same theta (transformers' Olmo3Config).
        params = {"full_attention": params,
                  "sliding_attention": {"rope_type": "default",
                                        "rope_theta": params.get("rope_theta",
                                                                 raw.get("rope_theta"))}}
    per_type = "full_attention" in params
    if "full_attention" in params:
        local_params = params.get("sliding_attention")
        params = dict(params["full_attention"])
        if local_params:
            local = _rope(dict(local_params), raw, head_dim, per_type)
    elif raw.get("rope_local_base_freq"):
        local = RopeConfig(theta=float(raw["rope_local_base_freq"]))
    partial = float(params.get("partial_rotary_factor", raw.get("partial_rotary_factor", 1.0)))
    rotary_dim = None
    if partial != 1.0 and params.get("rope_type") != "proportional":
        if not arch.partial_rotary:
            raise ValueError("partial_rotary_factor != 1 is supported for " + ", ".join(
                name for name, entry in ARCHITECTURES.items() if entry.partial_rotary) + " only")
        rotary_dim = int(head_dim * partial)
        if rotary_dim < 2 or rotary_dim % 2:
            raise ValueError(f"partial_rotary_factor {partial} gives an odd or empty rotary "
                             f"dimension ({rotary_dim}) for head_dim {head_dim}")
    rope = _rope(params, raw, rotary_dim or head_dim, per_type)
    return rope, local, rotary_dim


def _rope(params: dict[str, Any], raw: dict[str, Any], rotary_dim: int,
          per_type: bool = False) -> RopeConfig:
    theta = params.get("rope_theta", raw.get("rope_theta", 10000.0))
    rope_type = params.get("rope_type", params.get("type", "default"))
    if rope_type == "su":               # the first Phi-3 configs' name for longrope
        rope_type = "longrope"
    if rope_type not in ("default", "linear", "llama3", "longrope", "yarn", "proportional"):
        raise ValueError(f"unsupported rope type {rope_type!r}; Folio supports default, "
                         "linear, llama3, longrope, yarn and proportional")
    original = int(params.get("original_max_position_embeddings")
                   or raw.get("original_max_position_embeddings")
                   or raw.get("max_position_embeddings", 8192))
    rope = RopeConfig(
        theta=float(theta),
        rope_type=rope_type,
        factor=float(params.get("factor") or 1.0),
        low_freq_factor=float(params.get("low_freq_factor", 1.0)),
        high_freq_factor=float(params.get("high_freq_factor", 4.0)),
        original_max_position_embeddings=original,
    )
    if rope_type == "yarn":
        return _yarn(rope, params, raw, per_type)
    if rope_type == "proportional":
        return replace(rope, proportion=float(params.get("partial_rotary_factor", 1.0)))
    return _longrope(rope, params, raw, rotary_dim) if rope_type == "longrope" else rope


def _yarn(rope: RopeConfig, params: dict[str, Any], raw: dict[str, Any],
          per_type: bool) -> RopeConfig:
    # As transformers: without a factor, the ratio of the two lengths; the attention factor
    # from mscale / mscale_all_dim when both are given, else 0.1 ln(factor) + 1.
    original = rope.original_max_position_embeddings
    factor = params.get("factor") or raw.get("max_position_embeddings", original) / original

    def mscale(scale: float, m: float = 1.0) -> float:
        return 1.0 if scale <= 1 else 0.1 * m * math.log(scale) + 1.0

    attention = params.get("attention_factor")
    if attention is None and params.get("mscale") and params.get("mscale_all_dim"):
        attention = mscale(factor, params["mscale"]) / mscale(factor, params["mscale_all_dim"])
    elif attention is None:
        attention = mscale(factor)
    # transformers reads `truncate` from the top level of rope_parameters: with one dict per
    # layer type (OLMo 3) it is never there, so it is always on.
    truncate = True if per_type else bool(params.get("truncate", True))
    return replace(rope, factor=float(factor), attention_factor=float(attention),
                   beta_fast=float(params.get("beta_fast") or 32),
                   beta_slow=float(params.get("beta_slow") or 1), truncate=truncate)


def _longrope(rope: RopeConfig, params: dict[str, Any], raw: dict[str, Any],
              rotary_dim: int) -> RopeConfig:
    short, long = params.get("short_factor"), params.get("long_factor")
    for name, factors in (("short_factor", short), ("long_factor", long)):
        if not isinstance(factors, list) or len(factors) != rotary_dim // 2:
            raise ValueError(f"longrope {name} must be a list of {rotary_dim // 2} numbers")
    original = rope.original_max_position_embeddings
    # As transformers: without an explicit factor, the ratio of the two lengths.
    factor = params.get("factor") or raw.get("max_position_embeddings", original) / original
    attention = params.get("attention_factor")
    if attention is None:
        attention = 1.0 if factor <= 1.0 else math.sqrt(1 + math.log(factor)
                                                        / math.log(original))
    return replace(rope, factor=float(factor), short_factor=tuple(map(float, short)),
                   long_factor=tuple(map(float, long)), attention_factor=float(attention))


def _moe(raw: dict[str, Any], arch: Architecture, num_layers: int) -> MoeConfig | None:
    if arch.moe is None:
        return None
    if arch.moe in ("qwen3_next", "qwen3_5_moe", "lfm2_moe"):   # executor/models/hybrid/
        return hybrid_moe(arch.moe, raw, num_layers)
    experts = raw.get("num_local_experts") or raw.get("num_experts")
    top_k = raw.get("num_experts_per_tok")
    if not experts or not top_k or not 1 <= top_k <= experts:
        raise ValueError(f"num_experts_per_tok ({top_k}) must be between 1 and the number "
                         f"of experts ({experts})")
    if arch.moe == "gpt_oss":   # every layer; softmax over the top-k logits
        return MoeConfig(experts, top_k, raw["intermediate_size"], True, (True,) * num_layers,
                         swiglu=(float(raw.get("swiglu_alpha", 1.702)),
                                 float(raw.get("swiglu_limit", 7.0))))
    if arch.moe == "mixtral":
        return MoeConfig(experts, top_k, raw["intermediate_size"], True, (True,) * num_layers)
    step = raw.get("decoder_sparse_step") or 1
    dense = set(raw.get("mlp_only_layers") or ())
    sparse = tuple(i not in dense and (i + 1) % step == 0 for i in range(num_layers))
    return MoeConfig(experts, top_k, raw["moe_intermediate_size"],
                     bool(raw.get("norm_topk_prob", False)), sparse, round_weights=True)


def _positive(raw: dict[str, Any], key: str, default: float | None) -> float | None:
    # Absent: transformers' default for the architecture; null or 0: off.
    value = raw.get(key, default)
    return float(value) if value else None


def _as_id_tuple(value: Any) -> tuple[int, ...]:
    if value is None:
        return ()
    if isinstance(value, int):
        return (value,)
    return tuple(int(v) for v in value)
