"""The config.json keys of the GGUF families with sliding layers (OLMo 2/3, Gemma 2/3; no
torch import), as llama.cpp reads their files: which layers slide (one bool a layer in
attention.sliding_window_pattern, else llama.cpp's fixed period: OLMo 3 3 of 4, Gemma 2 1 of
2, Gemma 3 5 of 6), the rope of the sliding layers (Gemma 3's local base, 10000 unless
rope.freq_base_swa; the others' is the global one) and Gemma's query scale, which the
converter does not write (llama.cpp takes head_dim, or hidden / heads for the 27B models)."""

from __future__ import annotations

from typing import Any

from folio.executor.quantization.gguf.file import field, float32_decimal

# arch -> (the period of its sliding layers, its window when the file has none (None: no
# sliding layers), the block count of its 27B model, whose query scale is hidden / heads)
_FAMILIES = {"olmo2": (4, None, None), "gemma2": (2, 4096, 46), "gemma3": (6, None, 62)}


def windowed_config(reader: Any, arch: str, raw: dict[str, Any],
                    rope: dict[str, Any] | None) -> dict[str, Any]:
    period, default_window, big = _FAMILIES[arch]
    layers, theta = raw["num_hidden_layers"], raw["rope_theta"]
    out: dict[str, Any] = {}
    window = field(reader, f"{arch}.attention.sliding_window", default_window)
    if not window:   # OLMo 2, or a Gemma 3 without sliding layers
        out["layer_types"] = ["full_attention"] * layers
    else:
        pattern = field(reader, f"{arch}.attention.sliding_window_pattern")
        if pattern is None:
            pattern = [layer % period < period - 1 for layer in range(layers)]
        out["sliding_window"] = window
        out["layer_types"] = ["sliding_attention" if slides else "full_attention"
                              for slides in pattern]
    swa_theta = field(reader, f"{arch}.rope.freq_base_swa")
    if arch == "gemma3":
        local = float32_decimal(swa_theta) if swa_theta is not None else 10000.0
        out["rope_parameters"] = {
            "full_attention": {"rope_type": "default", "rope_theta": theta, **(rope or {})},
            "sliding_attention": {"rope_type": "default", "rope_theta": local}}
    else:
        if swa_theta is not None and float32_decimal(swa_theta) != theta:
            raise ValueError(f"metadata {arch}.rope.freq_base_swa differs from "
                             f"{arch}.rope.freq_base; Folio's {arch} has one rope base")
        if rope:
            out["rope_scaling"] = rope
    if big is not None:   # Gemma
        heads = raw["num_attention_heads"]
        out["query_pre_attn_scalar"] = (raw["hidden_size"] // heads if layers == big
                                        else raw["head_dim"])
        for key in ("attn_logit_softcapping", "final_logit_softcapping"):
            value = field(reader, f"{arch}.{key}")
            if value is not None:
                out[key] = float32_decimal(value)
    return out
