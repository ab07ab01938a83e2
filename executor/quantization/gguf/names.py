"""GGUF tensor names -> Hugging Face checkpoint names (no torch import)."""

from __future__ import annotations

import re
from dataclasses import dataclass


@dataclass(frozen=True)
class GgufArchitecture:
    hf_name: str            # the config.json architecture it reads as
    permuted_qk: bool       # llama.cpp's converter reorders q and k rows for its rope
    hybrid: str | None = None   # a hybrid family, read by executor/quantization/gguf/hybrid/
    layout: str = "llama"   # the layer's tensors: "llama", "olmo2" (a norm after each
                            # sublayer, none before; q/k norms over all heads at once) or
                            # "gemma" (norms before and after each sublayer);
                            # "gpt_oss": its own names (gguf/gpt_oss/names.py)
                            # "gemma4": read by executor/quantization/gguf/gemma4/


# The architectures whose GGUF tensors Folio reads: renamed (by layout), q/k rows put back
# where the converter permuted them, the hybrids' transforms undone (gguf/hybrid/), Gemma's
# norms served as stored. Others are refused (Phi-3's q/k/v are fused).
GGUF_ARCHITECTURES = {
    "llama": GgufArchitecture("LlamaForCausalLM", permuted_qk=True),
    "qwen2": GgufArchitecture("Qwen2ForCausalLM", permuted_qk=False),
    "qwen3": GgufArchitecture("Qwen3ForCausalLM", permuted_qk=False),
    # SmolLM3: a llama whose every 4th layer skips rotary; the file says nothing of it
    # (llama.cpp hard-codes it), which is transformers' default without no_rope_layers.
    "smollm3": GgufArchitecture("SmolLM3ForCausalLM", permuted_qk=True),
    # OLMo 2 and 3 (the converter writes both as olmo2): OLMo 3's sliding layers from
    # attention.sliding_window_pattern; a file without a window is OLMo 2 (all global).
    "olmo2": GgufArchitecture("Olmo3ForCausalLM", permuted_qk=False, layout="olmo2"),
    # Gemma 2 and 3: every norm stored as its scale 1 + w (the model multiplies by it as
    # stored: executor/models/layers.py hold_stored_scales).
    "gemma2": GgufArchitecture("Gemma2ForCausalLM", permuted_qk=False, layout="gemma"),
    "gemma3": GgufArchitecture("Gemma3ForCausalLM", permuted_qk=False, layout="gemma"),
    "lfm2": GgufArchitecture("Lfm2ForCausalLM", permuted_qk=False, hybrid="lfm2"),
    "qwen35": GgufArchitecture("Qwen3_5ForCausalLM", permuted_qk=False, hybrid="qwen35"),
    "qwen35moe": GgufArchitecture("Qwen3_5MoeForCausalLM", permuted_qk=False,
                                  hybrid="qwen35moe"),
    "lfm2moe": GgufArchitecture("Lfm2MoeForCausalLM", permuted_qk=False, hybrid="lfm2moe"),
    "qwen3next": GgufArchitecture("Qwen3NextForCausalLM", permuted_qk=False,
                                  hybrid="qwen3next"),
    # gpt-oss: experts split, transposed and MXFP4-repacked by the converter (gguf/gpt_oss/)
    "gpt-oss": GgufArchitecture("GptOssForCausalLM", permuted_qk=False, layout="gpt_oss"),
    # Gemma 4's text model: its own names, per-layer metadata and checks (gguf/gemma4/).
    "gemma4": GgufArchitecture("Gemma4ForCausalLM", permuted_qk=False, layout="gemma4"),
}

# Families Folio serves from a Hugging Face directory whose GGUF files it refuses, and why.
GGUF_REFUSED = {
    "phi3": "its fused attn_qkv and ffn_up tensors are not mapped",
}

# Tensors that are configuration, read by executor/quantization/gguf/config.py, not weights.
CONFIG_TENSORS = frozenset({"rope_freqs.weight"})
_GLOBAL = {"token_embd.weight": "model.embed_tokens.weight",
           "output_norm.weight": "model.norm.weight",
           "output.weight": "lm_head.weight"}
_LAYER = re.compile(r"^blk\.(\d+)\.(\w+)\.(weight|bias)$")
_LAYER_MODULES = {"attn_norm": "input_layernorm", "ffn_norm": "post_attention_layernorm",
                  "attn_q": "self_attn.q_proj", "attn_k": "self_attn.k_proj",
                  "attn_v": "self_attn.v_proj", "attn_output": "self_attn.o_proj",
                  "attn_q_norm": "self_attn.q_norm", "attn_k_norm": "self_attn.k_norm",
                  "ffn_gate": "mlp.gate_proj", "ffn_up": "mlp.up_proj",
                  "ffn_down": "mlp.down_proj"}
_OLMO2_MODULES = {**{key: value for key, value in _LAYER_MODULES.items()
                     if key not in ("attn_norm", "ffn_norm")},
                  "post_attention_norm": "post_attention_layernorm",
                  "post_ffw_norm": "post_feedforward_layernorm"}
_GEMMA_MODULES = {**_LAYER_MODULES, "ffn_norm": "pre_feedforward_layernorm",
                  "post_attention_norm": "post_attention_layernorm",
                  "post_ffw_norm": "post_feedforward_layernorm"}
LAYER_MODULES = {"llama": _LAYER_MODULES, "olmo2": _OLMO2_MODULES, "gemma": _GEMMA_MODULES}


def hf_name(gguf_name: str, layout: str = "llama") -> str | None:
    """The Hugging Face name of a GGUF tensor; None for one Folio has no place for."""
    if layout == "gpt_oss":
        from folio.executor.quantization.gguf.gpt_oss.names import gpt_oss_hf_name

        return gpt_oss_hf_name(gguf_name)
    if gguf_name in _GLOBAL:
        return _GLOBAL[gguf_name]
    modules = LAYER_MODULES[layout]
    match = _LAYER.match(gguf_name)
    if match is None or match.group(2) not in modules:
        return None
    layer, module, kind = match.groups()
    return f"model.layers.{layer}.{modules[module]}.{kind}"
