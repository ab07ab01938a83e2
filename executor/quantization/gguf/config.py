"""A GGUF file's metadata -> ModelConfig, through the same config.json reading every other
checkpoint takes (executor/models/hf_config.py). No torch import (read before any process
starts).

The architectures whose converter changes Folio undoes (or, Gemma's norms stored as
1 + w, serves as stored) are served; others are refused (Phi-3 fuses q/k/v).
"""

from __future__ import annotations

from typing import Any

from folio.executor.quantization.gguf.file import field, float32_decimal
from folio.executor.quantization.gguf.names import (GGUF_ARCHITECTURES, GGUF_REFUSED,
                                                    GgufArchitecture)
from folio.executor.quantization.gguf.rope import llama3_rope_parameters


_TORCH_DTYPES = {"F16": "float16", "BF16": "bfloat16"}


def gguf_architecture(reader: Any) -> tuple[str, GgufArchitecture]:
    name = field(reader, "general.architecture")
    if name in GGUF_REFUSED:
        raise ValueError(f"GGUF architecture {name!r} is not served: {GGUF_REFUSED[name]}; "
                         "serve its Hugging Face checkpoint directory")
    if name not in GGUF_ARCHITECTURES:
        raise ValueError(f"unsupported GGUF architecture {name!r}; Folio serves GGUF "
                         f"{', '.join(GGUF_ARCHITECTURES)}")
    return name, GGUF_ARCHITECTURES[name]


def gguf_hf_config(reader: Any) -> tuple[dict[str, Any], dict[str, Any]]:
    """The config.json and generation_config.json a Hugging Face checkpoint of this model
    would carry, from the file's metadata and tensor shapes (hf_config.py parses them)."""
    arch, spec = gguf_architecture(reader)
    if spec.layout == "gemma4":   # per-layer heads and widths (gguf/gemma4/config.py)
        from folio.executor.quantization.gguf.gemma4.config import gemma4_hf_config

        return gemma4_hf_config(reader, arch)
    tensors = {tensor.name: tensor for tensor in reader.tensors}
    # open_gguf's checks (validate.py) refused tensors with no place and a missing or
    # misshapen token_embd.weight before this reader was made.
    embed = tensors["token_embd.weight"]

    def need(key: str) -> Any:
        value = field(reader, f"{arch}.{key}")
        if value is None:
            raise ValueError(f"the GGUF metadata lacks {arch}.{key}")
        return value

    heads = need("attention.head_count")
    hidden = need("embedding_length")
    raw = {
        "architectures": [spec.hf_name],
        "vocab_size": int(embed.shape[1]),          # GGUF lists dims innermost first
        "hidden_size": hidden,
        "num_hidden_layers": need("block_count"),
        "num_attention_heads": heads,
        "num_key_value_heads": field(reader, f"{arch}.attention.head_count_kv", heads),
        "head_dim": field(reader, f"{arch}.attention.key_length") or hidden // heads,
        "rms_norm_eps": float32_decimal(need("attention.layer_norm_rms_epsilon")),
        "max_position_embeddings": need("context_length"),
        "rope_theta": float32_decimal(field(reader, f"{arch}.rope.freq_base", 10000.0)),
        "tie_word_embeddings": "output.weight" not in tensors,
        "attention_bias": "blk.0.attn_q.bias" in tensors,
        "torch_dtype": _TORCH_DTYPES.get(embed.tensor_type.name, "float32"),
    }
    # Qwen3.5-MoE has no dense MLP (hf_config.py takes the width one token runs through).
    if spec.hybrid != "qwen35moe" or field(reader, f"{arch}.feed_forward_length") is not None:
        raw["intermediate_size"] = need("feed_forward_length")
    if spec.hybrid is not None:   # executor/quantization/gguf/hybrid/config.py
        from folio.executor.quantization.gguf.hybrid.config import hybrid_config

        raw.update(hybrid_config(reader, arch, spec.hybrid, raw))
    elif spec.layout == "gpt_oss":   # experts, windows, YaRN (gguf/gpt_oss/config.py)
        from folio.executor.quantization.gguf.gpt_oss.config import gpt_oss_config

        raw.update(gpt_oss_config(reader, arch, raw))
    else:
        rope = _rope_parameters(reader, arch, tensors, raw["rope_theta"], raw["head_dim"])
        if spec.layout != "llama":   # OLMo 2/3, Gemma 2/3: sliding layers (gguf/windows.py)
            from folio.executor.quantization.gguf.windows import windowed_config

            raw.update(windowed_config(reader, arch, raw, rope))
        elif rope:
            raw["rope_scaling"] = rope
    # llama.cpp stops on every end-of-generation token: eos and, for chat models, eot.
    eos = [field(reader, f"tokenizer.ggml.{key}_token_id") for key in ("eos", "eot")]
    generation = {"eos_token_id": list(dict.fromkeys(int(t) for t in eos if t is not None))}
    return raw, generation


def _rope_parameters(reader: Any, arch: str, tensors: dict[str, Any], theta: float,
                     head_dim: int) -> dict[str, Any] | None:
    scaling = field(reader, f"{arch}.rope.scaling.type")
    if "rope_freqs.weight" in tensors:   # Llama 3.1's scaling, stored as its effect
        if scaling not in (None, "none"):
            raise ValueError(f"GGUF rope scaling {scaling!r} beside rope_freqs.weight")
        tensor = tensors["rope_freqs.weight"]
        if tensor.tensor_type.name != "F32":
            raise ValueError("rope_freqs.weight must be F32")
        return llama3_rope_parameters(tensor.data, theta, head_dim)
    if scaling in (None, "none"):
        return None
    if scaling == "linear":
        return {"rope_type": "linear",
                "factor": float32_decimal(field(reader, f"{arch}.rope.scaling.factor", 1.0))}
    raise ValueError(f"GGUF rope scaling {scaling!r} is not supported; Folio reads linear "
                     "and Llama 3's rope_freqs.weight")
