"""Writes a GGUF file from a tiny gpt-oss checkpoint (folio.tiny_models, float experts or
the MXFP4 *_blocks / *_scales of the released checkpoints) as llama.cpp's converter
(conversion/gpt_oss.py) writes one: gguf-py's gpt-oss names (the sinks with a `.weight`
suffix), the experts' gate_up_proj split into gate (its even columns) and up (its odd ones)
and transposed, down_proj transposed, the biases split alike; MXFP4 blocks repacked into
ggml's (the scale byte, then value i in the low nibble of byte i and i + 16 in its high
one); the window and YaRN keys, no sliding_window_pattern (llama.cpp's period 2).
1-D tensors and norms in F32, the other float tensors in `quant`."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from tests.executor.hybrid.gguf_writer import _add
from tests.executor.quantization.gguf_files import _add_tokenizer


def write_gpt_oss_gguf(model_dir: Path, out: Path, quant: str = "F32",
                       metadata: dict | None = None, drop: tuple[str, ...] = (),
                       retype: dict[str, str] | None = None) -> Path:
    """`metadata` ({key: (GGUFWriter add_* kind, value)}, `{arch}` filled in) replaces
    keys, `drop` leaves tensors (GGUF names) out, `retype` ({GGUF name: "MXFP4"}) writes a
    float tensor as MXFP4: the malformed files the tests refuse."""
    import gguf
    from safetensors.numpy import load_file

    config = json.loads((model_dir / "config.json").read_text())
    arch = gguf.MODEL_ARCH_NAMES[gguf.MODEL_ARCH.GPT_OSS]
    layers = config["num_hidden_layers"]
    writer = gguf.GGUFWriter(str(out), arch)
    writer.add_block_count(layers)
    writer.add_context_length(config["max_position_embeddings"])
    writer.add_embedding_length(config["hidden_size"])
    writer.add_feed_forward_length(config["intermediate_size"])
    writer.add_head_count(config["num_attention_heads"])
    writer.add_head_count_kv(config["num_key_value_heads"])
    rope = config.get("rope_parameters") or {}
    if rope.get("rope_type") == "yarn":
        writer.add_rope_scaling_type(gguf.RopeScalingType.YARN)
        writer.add_rope_scaling_factor(rope["factor"])
        writer.add_rope_scaling_orig_ctx_len(rope["original_max_position_embeddings"])
        for key in ("beta_fast", "beta_slow"):
            if rope.get(key) is not None:
                writer.add_float32(f"{arch}.rope.scaling.yarn_{key}", rope[key])
    writer.add_rope_freq_base(rope["rope_theta"])
    writer.add_layer_norm_rms_eps(config["rms_norm_eps"])
    writer.add_expert_count(config["num_local_experts"])
    writer.add_expert_used_count(config["num_experts_per_tok"])
    writer.add_key_length(config["head_dim"])
    writer.add_value_length(config["head_dim"])
    writer.add_sliding_window(config["sliding_window"])
    writer.add_expert_feed_forward_length(config["intermediate_size"])
    _add_tokenizer(writer, model_dir)
    for key, (kind, value) in (metadata or {}).items():
        getattr(writer, f"add_{kind}")(key.format(arch=arch), value)
    names = gguf.get_tensor_name_map(gguf.MODEL_ARCH.GPT_OSS, layers)
    tensors = load_file(str(model_dir / "model.safetensors"))
    for name, values in _converted(tensors):
        if name.endswith((".gate_proj.weight", ".up_proj.weight", ".down_proj.weight")) \
                and values.dtype == np.uint8:   # repacked MXFP4 blocks
            new_name = names.get_name(name, try_suffixes=(".weight",))
            if new_name not in drop:
                writer.add_tensor(new_name, values, raw_dtype=gguf.GGMLQuantizationType.MXFP4)
            continue
        new_name = names.get_name(name, try_suffixes=(".weight", ".bias"))
        if new_name is None:
            raise ValueError(f"gguf-py has no {arch} name for {name}")
        if new_name in drop:
            continue
        if (retype or {}).get(new_name) == "MXFP4":
            values = np.ascontiguousarray(values, dtype=np.float32)
            writer.add_tensor(new_name, gguf.quants.quantize(values,
                                                             gguf.GGMLQuantizationType.MXFP4),
                              raw_dtype=gguf.GGMLQuantizationType.MXFP4)
        else:
            _add(writer, new_name, values.astype(np.float32), quant)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return out


def _converted(tensors: dict[str, np.ndarray]):
    """(Hugging Face-style name gguf-py maps, values) as the converter yields them."""
    for name, values in sorted(tensors.items()):
        if name.endswith("self_attn.sinks"):
            yield name + ".weight", values
        elif name.endswith("experts.gate_up_proj_bias"):
            yield name.replace("gate_up_proj_bias", "gate_proj.bias"), values[..., 0::2]
            yield name.replace("gate_up_proj_bias", "up_proj.bias"), values[..., 1::2]
        elif name.endswith("experts.down_proj_bias"):
            yield name.replace("down_proj_bias", "down_proj.bias"), values
        elif name.endswith("experts.gate_up_proj"):   # [E, H, 2I] -> [E, 2I, H], split
            rows = values.transpose(0, 2, 1)
            yield name.replace("gate_up_proj", "gate_proj.weight"), rows[:, 0::2]
            yield name.replace("gate_up_proj", "up_proj.weight"), rows[:, 1::2]
        elif name.endswith("experts.down_proj"):      # [E, I, H] -> [E, H, I]
            yield name.replace("down_proj", "down_proj.weight"), values.transpose(0, 2, 1)
        elif name.endswith("experts.gate_up_proj_blocks"):   # rows [E, 2I, G, 16] split
            scales = tensors[name.replace("_blocks", "_scales")]
            yield (name.replace("gate_up_proj_blocks", "gate_proj.weight"),
                   ggml_mxfp4(values[:, 0::2], scales[:, 0::2]))
            yield (name.replace("gate_up_proj_blocks", "up_proj.weight"),
                   ggml_mxfp4(values[:, 1::2], scales[:, 1::2]))
        elif name.endswith("experts.down_proj_blocks"):
            yield (name.replace("down_proj_blocks", "down_proj.weight"),
                   ggml_mxfp4(values, tensors[name.replace("_blocks", "_scales")]))
        elif not name.endswith("_scales"):
            yield name, values


def ggml_mxfp4(blocks: np.ndarray, scales: np.ndarray) -> np.ndarray:
    """The checkpoint's [E, rows, G, 16] blocks (values 2j and 2j + 1 in byte j's low and
    high nibbles) and [E, rows, G] scales -> ggml's [E, rows, G * 17] bytes."""
    codes = np.stack((blocks & 0x0F, blocks >> 4), axis=-1).reshape(*blocks.shape[:-1], 32)
    packed = codes[..., :16] | (codes[..., 16:] << 4)
    data = np.concatenate((scales[..., None], packed), axis=-1).astype(np.uint8)
    return np.ascontiguousarray(data.reshape(*data.shape[:-2], -1))
