"""Writes a GGUF file from a tiny Gemma 4 checkpoint (tests/executor/gemma4/checkpoints.py)
as llama.cpp's converter writes one (conversion/gemma.py, Gemma4Model over Gemma3Model and
TextModel): its metadata keys (the global head size as key_length, the sliding one as
key_length_swa, from per_layer_config where transformers saved them there; KV heads one
a layer where the global layers have their own; one
feed-forward width a layer with use_double_wide_mlp; the sliding pattern; the shared KV
layers; the per-layer input width; the rope bases), gguf-py's tensor names for `gemma4`,
the router's scale and per-expert scale as `.scale` tensors, layer_scalar as
layer_output_scale.weight, and rope_freqs.weight: 1 for the global layers' rotated pairs,
1e30 past them. No norm is shifted (Gemma 4's norm_shift is 0). 1-D tensors and norms in
F32, the rest in `quant` (F16 where a row is not whole blocks)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from tests.executor.hybrid.gguf_writer import _add
from tests.executor.quantization.gguf_files import _add_tokenizer


def write_gemma4_gguf(model_dir: Path, out: Path, quant: str = "F32",
                      metadata: dict | None = None, drop: tuple[str, ...] = (),
                      tensors: dict | None = None) -> Path:
    """`metadata` ({key: (GGUFWriter add_* kind, value)}, `{arch}` filled in) replaces
    keys; `drop` leaves tensors (GGUF names) out; `tensors` ({GGUF name: values}) replaces
    or adds some: the malformed files the tests refuse."""
    import gguf
    from safetensors.numpy import load_file

    config = json.loads((model_dir / "config.json").read_text())
    arch = gguf.MODEL_ARCH_NAMES[gguf.MODEL_ARCH.GEMMA4]
    layers = config["num_hidden_layers"]
    kinds = config["layer_types"]
    swa = [kind == "sliding_attention" for kind in kinds]
    shared = config.get("num_kv_shared_layers") or 0
    # transformers 5 saves the global layers' head size and KV heads in per_layer_config
    # (global_head_dim and num_global_key_value_heads left null): the converter looks there
    per_layer = {int(i): entry for i, entry in (config.get("per_layer_config") or {}).items()}
    full = next(i for i, kind in enumerate(kinds) if kind == "full_attention")
    head_full = config.get("global_head_dim") or per_layer[full]["head_dim"]
    kv_full = (config.get("num_global_key_value_heads")
               or per_layer.get(full, {}).get("num_key_value_heads"))
    head_swa = config["head_dim"]
    writer = gguf.GGUFWriter(str(out), arch)
    writer.add_block_count(layers)
    writer.add_context_length(config["max_position_embeddings"])
    writer.add_embedding_length(config["hidden_size"])
    ffn = config["intermediate_size"]
    if config.get("use_double_wide_mlp"):
        writer.add_feed_forward_length([ffn if i < layers - shared else 2 * ffn
                                        for i in range(layers)])
    else:
        writer.add_feed_forward_length(ffn)
    writer.add_head_count(config["num_attention_heads"])
    kv = config["num_key_value_heads"]
    if kv_full is not None:
        writer.add_head_count_kv([kv if slides else kv_full for slides in swa])
    else:
        writer.add_head_count_kv(kv)
    rope = config["rope_parameters"]
    writer.add_rope_freq_base(rope["full_attention"]["rope_theta"])
    writer.add_rope_freq_base_swa(rope["sliding_attention"]["rope_theta"])
    writer.add_layer_norm_rms_eps(config["rms_norm_eps"])
    writer.add_key_length(head_full)
    writer.add_value_length(head_full)
    writer.add_key_length_swa(head_swa)
    writer.add_value_length_swa(head_swa)
    if config.get("final_logit_softcapping"):
        writer.add_final_logit_softcapping(config["final_logit_softcapping"])
    writer.add_sliding_window(config["sliding_window"])
    writer.add_shared_kv_layers(shared)
    writer.add_embedding_length_per_layer_input(config.get("hidden_size_per_layer_input") or 0)
    writer.add_sliding_window_pattern(swa)
    writer.add_rope_dimension_count(head_full)
    writer.add_rope_dimension_count_swa(head_swa)
    if config.get("enable_moe_block"):
        writer.add_expert_count(config["num_experts"])
        writer.add_expert_used_count(config["top_k_experts"])
        writer.add_expert_feed_forward_length(config["moe_intermediate_size"])
    _add_tokenizer(writer, model_dir)
    for key, (kind, value) in (metadata or {}).items():
        getattr(writer, f"add_{kind}")(key.format(arch=arch), value)
    rotated = int(head_full * rope["full_attention"]["partial_rotary_factor"] / 2)
    out_tensors = {"rope_freqs.weight": np.array(
        [1.0] * rotated + [1e30] * (head_full // 2 - rotated), dtype=np.float32)}
    names = gguf.get_tensor_name_map(gguf.MODEL_ARCH.GEMMA4, layers)
    for name, values in load_file(str(model_dir / "model.safetensors")).items():
        name = name.replace("language_model.", "")
        values = values.astype(np.float32)
        if name.endswith("router.scale"):
            new_name = name.replace("model.layers.", "blk.").replace("router.scale",
                                                                      "ffn_gate_inp.scale")
        elif name.endswith("router.per_expert_scale"):
            new_name = name.replace("model.layers.", "blk.").replace(
                "router.per_expert_scale", "ffn_down_exps.scale")
        else:
            if name.endswith(("layer_scalar", "experts.gate_up_proj", "experts.down_proj")):
                name += ".weight"   # the converter's filter_tensors
            new_name = names.get_name(name, try_suffixes=(".weight", ".bias"))
        if new_name is None:
            raise ValueError(f"gguf-py has no {arch} name for {name}")
        out_tensors[new_name] = values
    out_tensors.update(tensors or {})
    for new_name, values in sorted(out_tensors.items()):
        if new_name not in drop:
            _add(writer, new_name, values, quant)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return out
