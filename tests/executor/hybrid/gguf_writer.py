"""Writes a GGUF file from a tiny LFM2, Qwen3.5, Qwen3.5-MoE or LFM2-MoE checkpoint
(checkpoints.py, moe_checkpoints.py) as llama.cpp's converter (convert_hf_to_gguf.py,
conversion/lfm2.py and qwen.py) writes one: its metadata keys, gguf-py's tensor names, and
its transforms. Qwen3.5: the value heads reordered from grouped by key head to tiled where
the key heads are fewer, A_log stored as -exp(A_log), dt_bias as ssm_dt.bias, the
convolution squeezed, the zero-centred norms (all but the Gated DeltaNet's output norm)
stored as 1 + weight; the layer kinds as attention.recurrent_layers (newer converters than
gguf-py 0.19.0 write it) beside full_attention_interval; the MoE variants' experts stacked
one tensor a projection. LFM2: one KV head count per layer (0 on the convolution layers),
the adjusted feed-forward width (LFM2-MoE: the dense layers' width as given), the
convolution squeezed, LFM2-MoE's expert bias as exp_probs_b.bias and no routed scaling or
top-k normalisation (the converter writes none). 1-D tensors, norms, routers and the
convolutions in F32; 2-D ones in `quant`, F16 where a row is not whole blocks."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import torch

from tests.executor.quantization.gguf_files import _add_tokenizer

RECURRENT_LAYERS = "{arch}.attention.recurrent_layers"


def write_hybrid_gguf(model_dir: Path, out: Path, quant: str = "F32",
                      mtp_block: bool = False, metadata: dict | None = None,
                      drop: tuple[str, ...] = ()) -> Path:
    """`mtp_block`: a Qwen3.5 file also carries a multi-token-prediction block after the
    trunk layers (blk.N, nextn_predict_layers 1), as the converter writes by default.
    `metadata` ({key: (GGUFWriter add_* kind, value)}) replaces keys; `drop` leaves tensors
    (GGUF names) out: the malformed files the tests refuse."""
    import gguf
    from safetensors.torch import load_file

    config = read_config(model_dir)
    model_arch = {"lfm2": gguf.MODEL_ARCH.LFM2, "lfm2_moe": gguf.MODEL_ARCH.LFM2MOE,
                  "qwen3_5_text": gguf.MODEL_ARCH.QWEN35,
                  "qwen3_5_moe_text": gguf.MODEL_ARCH.QWEN35MOE,
                  "qwen3_next": gguf.MODEL_ARCH.QWEN3NEXT}[config["model_type"]]
    lfm2 = config["model_type"].startswith("lfm2")
    moe = config["model_type"].endswith(("moe", "moe_text", "next"))
    arch = gguf.MODEL_ARCH_NAMES[model_arch]
    layers = config["num_hidden_layers"]
    writer = gguf.GGUFWriter(str(out), arch)
    (_lfm2_metadata if lfm2 else _qwen35_metadata)(writer, config, mtp_block)
    _add_tokenizer(writer, model_dir)
    for key, (kind, value) in (metadata or {}).items():
        getattr(writer, f"add_{kind}")(key.format(arch=arch), value)
    names = gguf.get_tensor_name_map(model_arch, layers + 1)
    tensors = load_file(str(model_dir / "model.safetensors"))
    if mtp_block:   # an attention layer's tensors again, and the block's own projection
        attention = config["layer_types"].index("full_attention")
        for name, values in list(tensors.items()):
            prefix = f"model.layers.{attention}."
            if name.startswith(prefix):
                tensors[f"model.layers.{layers}." + name[len(prefix):]] = values.clone()
        eh_proj = torch.randn(config["hidden_size"], 2 * config["hidden_size"])
    if moe:
        tensors = _stacked_experts(tensors, config)
    for name, values in sorted(tensors.items()):
        for new_name, data in _converted(name, values.float(), config, lfm2):
            if _gguf_name(names, new_name) not in drop:
                _add(writer, _gguf_name(names, new_name), data.numpy(), quant)
    if mtp_block:
        _add(writer, f"blk.{layers}.nextn.eh_proj.weight", eh_proj.numpy(), quant)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return out


def _lfm2_metadata(writer, config: dict, mtp_block: bool) -> None:
    import gguf

    from folio.executor.models.hybrid.spec import lfm2_intermediate_size

    _common_metadata(writer, config)
    writer.add_head_count_kv([config["num_key_value_heads"] if kind == "full_attention"
                              else 0 for kind in config["layer_types"]])
    if config.get("num_experts"):   # the dense layers' width as given
        writer.add_feed_forward_length(config["intermediate_size"])
        writer.add_expert_count(config["num_experts"])
        writer.add_expert_used_count(config["num_experts_per_tok"])
        writer.add_expert_feed_forward_length(config["moe_intermediate_size"])
        writer.add_leading_dense_block_count(config["num_dense_layers"])
        writer.add_expert_gating_func(gguf.ExpertGatingFuncType.SIGMOID)
    else:
        writer.add_feed_forward_length(lfm2_intermediate_size(config))
    writer.add_layer_norm_rms_eps(config["norm_eps"])
    writer.add_vocab_size(config["vocab_size"])
    writer.add_shortconv_l_cache(config["conv_L_cache"])


def _stacked_experts(tensors: dict, config: dict) -> dict:
    """The converter stacks one module per expert into one tensor a projection [E, out, in]."""
    stacked = {}
    for name, values in tensors.items():
        parts = name.split(".")
        if "experts" not in parts:
            stacked[name] = values
        elif parts[parts.index("experts") + 1] == "0":
            at = parts.index("experts")
            stacked[".".join(parts[:at + 1] + parts[at + 2:])] = torch.stack([
                tensors[".".join(parts[:at + 1] + [str(e)] + parts[at + 2:])]
                for e in range(config["num_experts"])])
    return stacked


def _qwen35_metadata(writer, config: dict, mtp_block: bool) -> None:
    rope = config["rope_parameters"]
    head_dim = config["head_dim"]
    _common_metadata(writer, config, extra_layers=int(mtp_block))
    writer.add_head_count_kv(config["num_key_value_heads"])
    if config.get("intermediate_size"):   # none in Qwen3.5-MoE
        writer.add_feed_forward_length(config["intermediate_size"])
    if config.get("num_experts"):
        writer.add_expert_count(config["num_experts"])
        writer.add_expert_used_count(config["num_experts_per_tok"])
        writer.add_expert_feed_forward_length(config["moe_intermediate_size"])
        writer.add_expert_shared_feed_forward_length(
            config["shared_expert_intermediate_size"])
    writer.add_layer_norm_rms_eps(config["rms_norm_eps"])
    writer.add_key_length(head_dim)
    writer.add_value_length(head_dim)
    if "mrope_section" in rope:   # Qwen3.5's (Qwen3-Next has none)
        writer.add_rope_dimension_sections((rope["mrope_section"] + [0] * 4)[:4])
    writer.add_rope_dimension_count(int(head_dim * rope["partial_rotary_factor"]))
    writer.add_ssm_conv_kernel(config["linear_conv_kernel_dim"])
    writer.add_ssm_state_size(config["linear_key_head_dim"])
    writer.add_ssm_group_count(config["linear_num_key_heads"])
    writer.add_ssm_time_step_rank(config["linear_num_value_heads"])
    writer.add_ssm_inner_size(config["linear_value_head_dim"]
                              * config["linear_num_value_heads"])
    recurrent = [kind == "linear_attention" for kind in config["layer_types"]]
    writer.add_array(RECURRENT_LAYERS.format(arch=writer.arch),
                     recurrent + [False] * int(mtp_block))
    writer.add_full_attention_interval(config.get("full_attention_interval", 4))
    if mtp_block:
        writer.add_nextn_predict_layers(1)


def _common_metadata(writer, config: dict, extra_layers: int = 0) -> None:
    writer.add_block_count(config["num_hidden_layers"] + extra_layers)
    writer.add_context_length(config["max_position_embeddings"])
    writer.add_embedding_length(config["hidden_size"])
    writer.add_head_count(config["num_attention_heads"])
    writer.add_rope_freq_base(config["rope_parameters"]["rope_theta"])


def _tiled(values: torch.Tensor, dim: int, config: dict, unit: int) -> torch.Tensor:
    """The converter's value-head reorder: grouped by key head -> tiled."""
    k_heads = config["linear_num_key_heads"]
    per_k = config["linear_num_value_heads"] // k_heads
    shape = list(values.shape)
    split = shape[:dim] + [k_heads, per_k, unit] + shape[dim + 1:]
    return values.reshape(split).transpose(dim, dim + 1).contiguous().reshape(shape)


def _converted(name: str, values: torch.Tensor, config: dict, lfm2: bool):
    """(new name, tensor) as the converter's modify_tensors yields them."""
    if lfm2:
        if "conv.conv" in name:
            values = values.squeeze(1)
        if name.endswith(".expert_bias"):
            name += ".bias"
        yield name, values
        return
    if name.endswith("in_proj_qkvz.weight"):   # Qwen3-Next: per key head q, k, v, z
        yield from split_qkvz(name, values, config)
        return
    if ("linear_attn." in name and config["model_type"].startswith("qwen3_5")
            and config["linear_num_key_heads"] != config["linear_num_value_heads"]):
        v_dim = config["linear_value_head_dim"]
        keys = 2 * config["linear_num_key_heads"] * config["linear_key_head_dim"]
        if ".in_proj_qkv." in name or ".conv1d" in name:
            values = values.squeeze() if ".conv1d" in name else values
            values = torch.cat([values[:keys], _tiled(values[keys:], 0, config, v_dim)])
        elif ".in_proj_z." in name:
            values = _tiled(values, 0, config, v_dim)
        elif ".in_proj_b." in name or ".in_proj_a." in name:
            values = _tiled(values, 0, config, 1)
        elif name.endswith((".A_log", ".dt_bias")):
            values = _tiled(values.unsqueeze(-1), 0, config, 1).squeeze(-1)
        elif ".out_proj." in name:
            values = _tiled(values, 1, config, v_dim)
    if name.endswith(".A_log"):
        values = -torch.exp(values)
    elif name.endswith(".dt_bias"):
        name = name.removesuffix(".dt_bias") + ".dt_proj.bias"
    elif "conv1d" in name:
        values = values.squeeze()
    elif name.endswith("norm.weight") and not name.endswith("linear_attn.norm.weight"):
        values = values + 1
    yield name, values


def read_config(model_dir: Path) -> dict:
    return json.loads((model_dir / "config.json").read_text())


def split_qkvz(name: str, values: torch.Tensor, config: dict):
    """Qwen3-Next's converter: in_proj_qkvz's rows grouped per key head (its q, k, then the
    v and z of the value heads it serves) -> attn_qkv (all q, all k, all v) and attn_gate."""
    k_heads = config["linear_num_key_heads"]
    k_dim = config["linear_key_head_dim"]
    v_width = config["linear_num_value_heads"] // k_heads * config["linear_value_head_dim"]
    grouped = values.reshape(k_heads, 2 * k_dim + 2 * v_width, -1)
    q, k, v, z = grouped.split([k_dim, k_dim, v_width, v_width], dim=1)
    hidden = values.shape[-1]
    prefix = name.removesuffix("in_proj_qkvz.weight")
    yield prefix + "in_proj_qkv.weight", torch.cat([p.reshape(-1, hidden) for p in (q, k, v)])
    yield prefix + "in_proj_z.weight", z.reshape(-1, hidden)


def _gguf_name(names, name: str) -> str:
    new_name = names.get_name(name, try_suffixes=(".weight", ".bias"))
    if new_name is None:   # LFM2-MoE's converter names its stacked experts layers.N.*
        new_name = names.get_name(name.removeprefix("model."),
                                  try_suffixes=(".weight", ".bias"))
    if new_name is None:
        raise ValueError(f"gguf-py has no name for {name}")
    return new_name


def _add(writer, name: str, values: np.ndarray, quant: str) -> None:
    import gguf

    float_only = (values.ndim <= 1 or name.endswith("_norm.weight")
                  or not name.endswith(".weight") or ".ssm_conv1d." in name
                  or ".shortconv.conv." in name or ".ffn_gate_inp" in name)
    qtype = gguf.GGMLQuantizationType.F32 if float_only else gguf.GGMLQuantizationType[quant]
    values = np.ascontiguousarray(values, dtype=np.float32)
    if qtype == gguf.GGMLQuantizationType.F32:
        writer.add_tensor(name, values)
        return
    if qtype not in (gguf.GGMLQuantizationType.F16, gguf.GGMLQuantizationType.BF16) and \
            values.shape[-1] % gguf.GGML_QUANT_SIZES[qtype][0]:
        qtype = gguf.GGMLQuantizationType.F16   # as the converter falls back
    if qtype == gguf.GGMLQuantizationType.F16:
        writer.add_tensor(name, values.astype(np.float16))
    else:
        writer.add_tensor(name, gguf.quants.quantize(values, qtype), raw_dtype=qtype)
