"""A gpt-oss GGUF file's metadata -> the config.json keys its Hugging Face checkpoint
carries (no torch import); gguf/config.py reads the keys every family shares.

What llama.cpp's converter writes and how llama.cpp reads it: the experts' count, top-k and
width (`expert_feed_forward_length`, the checkpoint's intermediate_size); the window
(`attention.sliding_window`) and which layers slide (`attention.sliding_window_pattern`:
one bool a layer, or a period, else llama.cpp's period 2: even layers slide, as gpt-oss's
layer_types); YaRN as `rope.scaling.*` (factor, original context, beta_fast/slow when the
checkpoint gives them). Nothing says the SwiGLU's alpha and limit: llama.cpp hard-codes
gpt-oss's 1.702 and 7.0, and so does this. Nor `truncate`: every gpt-oss checkpoint has it
off (the band edges of YaRN's ramp not rounded), and the file is read as the gpt-oss it was
converted from (llama.cpp's rope rounds them; transformers, on the checkpoint, does not)."""

from __future__ import annotations

from typing import Any

from folio.executor.quantization.gguf.file import field, float32_decimal

SWIGLU_ALPHA, SWIGLU_LIMIT = 1.702, 7.0   # llama.cpp's LLM_FFN_SWIGLU_OAI_MOE
DEFAULT_PERIOD = 2                       # llama.cpp's gpt-oss: load_swa_pattern(ml, 2)


def gpt_oss_config(reader: Any, arch: str, common: dict[str, Any]) -> dict[str, Any]:
    """The keys to add to (or put in place of) `common`, gguf/config.py's reading."""
    def need(key: str) -> Any:
        value = field(reader, f"{arch}.{key}")
        if value is None:
            raise ValueError(f"the GGUF metadata lacks {arch}.{key}")
        return value

    scale = field(reader, f"{arch}.expert_weights_scale")
    if scale not in (None, 0, 1):   # llama.cpp scales the routing weights by it
        raise ValueError(f"metadata {arch}.expert_weights_scale is {scale}: gpt-oss's "
                         "routing weights are not scaled")
    key_length = need("attention.key_length")
    value_length = field(reader, f"{arch}.attention.value_length", key_length)
    if value_length != key_length:
        raise ValueError(f"metadata {arch}.attention.value_length ({value_length}) differs "
                         f"from {arch}.attention.key_length ({key_length})")
    layers = common["num_hidden_layers"]
    return {"num_local_experts": need("expert_count"),
            "num_experts_per_tok": need("expert_used_count"),
            "intermediate_size": need("expert_feed_forward_length"),
            "swiglu_alpha": SWIGLU_ALPHA, "swiglu_limit": SWIGLU_LIMIT,
            "sliding_window": need("attention.sliding_window"),
            "layer_types": layer_types(field(reader, f"{arch}.attention.sliding_window_pattern"),
                                       layers, arch),
            "rope_parameters": rope_parameters(reader, arch, common["rope_theta"])}


def layer_types(pattern: Any, layers: int, arch: str) -> list[str]:
    """One bool a layer, or a period n (each n-th layer full, the others sliding)."""
    if pattern is None:
        pattern = DEFAULT_PERIOD
    if isinstance(pattern, list):
        if len(pattern) != layers:
            raise ValueError(f"metadata {arch}.attention.sliding_window_pattern lists "
                             f"{len(pattern)} layers; block_count is {layers}")
        slides = [bool(flag) for flag in pattern]
    else:
        slides = [pattern == 0 or layer % pattern < pattern - 1 for layer in range(layers)]
    return ["sliding_attention" if flag else "full_attention" for flag in slides]


def rope_parameters(reader: Any, arch: str, theta: float) -> dict[str, Any]:
    """config.json's rope_parameters: the base, and YaRN from rope.scaling.* (the sliding
    layers' too: gpt-oss has one rope)."""
    swa_theta = field(reader, f"{arch}.rope.freq_base_swa")
    if swa_theta is not None and float32_decimal(swa_theta) != theta:
        raise ValueError(f"metadata {arch}.rope.freq_base_swa differs from "
                         f"{arch}.rope.freq_base; gpt-oss has one rope base")
    scaling = field(reader, f"{arch}.rope.scaling.type")
    if scaling in (None, "none"):
        return {"rope_type": "default", "rope_theta": theta}
    if scaling != "yarn":
        raise ValueError(f"GGUF rope scaling {scaling!r} is not supported for {arch}; "
                         "Folio reads yarn")
    for key, neutral in (("yarn_ext_factor", 1.0), ("yarn_log_multiplier", 0.0)):
        value = field(reader, f"{arch}.rope.scaling.{key}")
        if value is not None and value != neutral:
            raise ValueError(f"metadata {arch}.rope.scaling.{key} is {value}: Folio's YaRN "
                             f"takes {neutral}")
    factor = field(reader, f"{arch}.rope.scaling.factor")
    if factor is None:
        raise ValueError(f"the GGUF metadata lacks {arch}.rope.scaling.factor (yarn)")
    out = {"rope_type": "yarn", "rope_theta": theta, "truncate": False,
           "factor": float32_decimal(factor)}
    original = field(reader, f"{arch}.rope.scaling.original_context_length")
    if original is not None:
        out["original_max_position_embeddings"] = int(original)
    for key, name in (("yarn_beta_fast", "beta_fast"), ("yarn_beta_slow", "beta_slow"),
                      ("yarn_attn_factor", "attention_factor")):
        value = field(reader, f"{arch}.rope.scaling.{key}")
        if value is not None:
            out[name] = float32_decimal(value)
    return out
