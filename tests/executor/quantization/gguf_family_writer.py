"""Writes a GGUF file from a tiny SmolLM3, OLMo 3 or Gemma 2/3 checkpoint (folio.tiny_models) as
llama.cpp's converter (convert_hf_to_gguf.py, conversion/llama.py and olmo.py) writes one:
its metadata keys, gguf-py's tensor names for the architecture, and its transforms.
SmolLM3 (`smollm3`): q and k rows permuted for llama.cpp's rope, as a llama's; no key says
which layers skip rotary (llama.cpp hard-codes every 4th). OLMo 3 (`olmo2`): the sliding
window and one bool per layer (sliding_window_pattern); OLMo 2's (a checkpoint with no
sliding layer here) neither. Gemma 2 (`gemma2`) and 3 (`gemma3`): every norm stored as
its scale 1 + w, the soft-capping, the window (the sliding layers are llama.cpp's fixed
period), Gemma 3's global rope base and linear scaling. 1-D tensors and norms in F32,
2-D ones in `quant` (F16 where a row is not whole blocks)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from tests.executor.hybrid.gguf_writer import _add
from tests.executor.quantization.gguf_files import _add_tokenizer, permute_rows


def write_family_gguf(model_dir: Path, out: Path, quant: str = "F32",
                      metadata: dict | None = None, drop: tuple[str, ...] = ()) -> Path:
    """`metadata` ({key: (GGUFWriter add_* kind, value)}, `{arch}` filled in) replaces
    keys; `drop` leaves tensors (GGUF names) out: the malformed files the tests refuse."""
    import gguf
    from safetensors.numpy import load_file

    config = json.loads((model_dir / "config.json").read_text())
    model_arch = {"smollm3": gguf.MODEL_ARCH.SMOLLM3, "olmo3": gguf.MODEL_ARCH.OLMO2,
                  "gemma2": gguf.MODEL_ARCH.GEMMA2,
                  "gemma3_text": gguf.MODEL_ARCH.GEMMA3}[config["model_type"]]
    gemma = config["model_type"].startswith("gemma")
    arch = gguf.MODEL_ARCH_NAMES[model_arch]
    layers = config["num_hidden_layers"]
    heads, kv_heads = config["num_attention_heads"], config["num_key_value_heads"]
    head_dim = config.get("head_dim") or config["hidden_size"] // heads
    writer = gguf.GGUFWriter(str(out), arch)
    writer.add_block_count(layers)
    writer.add_context_length(config["max_position_embeddings"])
    writer.add_embedding_length(config["hidden_size"])
    writer.add_feed_forward_length(config["intermediate_size"])
    writer.add_head_count(heads)
    writer.add_head_count_kv(kv_heads)
    writer.add_layer_norm_rms_eps(config["rms_norm_eps"])
    rope = config.get("rope_parameters") or {}
    rope = rope.get("full_attention", rope)
    writer.add_rope_freq_base(rope.get("rope_theta") or config.get("rope_theta", 10000.0))
    if rope.get("rope_type") == "linear":
        writer.add_rope_scaling_type(gguf.RopeScalingType.LINEAR)
        writer.add_rope_scaling_factor(rope["factor"])
    for key in ("attn_logit_softcapping", "final_logit_softcapping"):
        if config.get(key):
            writer.add_float32(f"{arch}.{key}", config[key])
    writer.add_rope_dimension_count(head_dim)
    writer.add_key_length(head_dim)
    writer.add_value_length(head_dim)
    writer.add_vocab_size(config["vocab_size"])
    if "sliding_attention" in config.get("layer_types", []):
        writer.add_sliding_window(config["sliding_window"])
        if not gemma:   # Gemma's is llama.cpp's fixed period
            writer.add_sliding_window_pattern([kind == "sliding_attention"
                                               for kind in config["layer_types"]])
    _add_tokenizer(writer, model_dir)
    for key, (kind, value) in (metadata or {}).items():
        getattr(writer, f"add_{kind}")(key.format(arch=arch), value)
    names = gguf.get_tensor_name_map(model_arch, layers)
    for name, values in sorted(load_file(str(model_dir / "model.safetensors")).items()):
        values = values.astype(np.float32)
        if model_arch == gguf.MODEL_ARCH.SMOLLM3 and name.endswith("q_proj.weight"):
            values = permute_rows(values, heads)
        elif model_arch == gguf.MODEL_ARCH.SMOLLM3 and name.endswith("k_proj.weight"):
            values = permute_rows(values, kv_heads)
        new_name = names.get_name(name, try_suffixes=(".weight", ".bias"))
        if gemma and name.endswith("norm.weight"):   # (1 + w) stored as its scale
            values = values + np.float32(1)
        if new_name is None:
            raise ValueError(f"gguf-py has no {arch} name for {name}")
        if new_name not in drop:
            _add(writer, new_name, values, quant)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return out
