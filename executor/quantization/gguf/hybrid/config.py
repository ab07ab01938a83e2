"""A hybrid GGUF file's metadata -> the config.json keys its Hugging Face checkpoint carries
(no torch import); gguf/config.py reads the keys every family shares.

LFM2: llama.cpp's converter writes one KV head count per layer, 0 on the convolution
layers (that is how the file tells the layer kinds), the feed-forward width already
adjusted, and the convolution's window as shortconv.l_cache. Qwen3.5: the Gated DeltaNet's
sizes as ssm.* keys (state_size the key head size, group_count the key heads,
time_step_rank the value heads, inner_size all value heads' width), the attention layers as
attention.recurrent_layers (newer converters) or full_attention_interval, the rotary width
in dimensions, and the multi-token-prediction block as extra layers (nextn_predict_layers).
The MoE variants add expert_* keys (LFM2-MoE: leading_dense_block_count dense layers
first)."""

from __future__ import annotations

from typing import Any

from folio.executor.quantization.gguf.file import field, float32_decimal

# Newer converters than gguf-py 0.19.0 write this key (one bool per layer).
RECURRENT_LAYERS = "{arch}.attention.recurrent_layers"


def hybrid_config(reader: Any, arch: str, family: str, common: dict[str, Any]
                  ) -> dict[str, Any]:
    """The keys to add to (or put in place of) `common`, gguf/config.py's reading."""
    def need(key: str) -> Any:
        value = field(reader, f"{arch}.{key}")
        if value is None:
            raise ValueError(f"the GGUF metadata lacks {arch}.{key}")
        return value

    scaling = field(reader, f"{arch}.rope.scaling.type")
    if scaling not in (None, "none"):
        raise ValueError(f"GGUF rope scaling {scaling!r} is not supported for {arch}")
    lfm2 = family in ("lfm2", "lfm2moe")
    fields = (_lfm2 if lfm2 else _qwen35)(reader, arch, need, common)
    if family == "lfm2moe":
        fields.update(_lfm2moe(reader, arch, need))
    if family == "qwen3next":
        # llama.cpp's converter writes no top-k normalisation (llama.cpp renormalises) and
        # has no name for a dense MLP layer (every layer has experts)
        fields.update({"norm_topk_prob": bool(field(reader, f"{arch}.expert_weights_norm",
                                                    True)),
                       "decoder_sparse_step": 1, "mlp_only_layers": []})
    if family in ("qwen35moe", "qwen3next"):   # the experts' and the shared expert's sizes
        fields.update({"num_experts": need("expert_count"),
                       "num_experts_per_tok": need("expert_used_count"),
                       "moe_intermediate_size": need("expert_feed_forward_length"),
                       "shared_expert_intermediate_size":
                           need("expert_shared_feed_forward_length")})
    _check_kinds(reader, arch, fields["layer_types"], fields.get("num_dense_layers"))
    return fields


def _check_kinds(reader: Any, arch: str, types: list[str], dense: int | None) -> None:
    """Each layer's tensors are those of the kind the metadata gives it; with `dense` (the
    MoE's leading dense layers), its feed-forward too."""
    names = {tensor.name for tensor in reader.tensors}
    for layer, kind in enumerate(types):
        attention = f"blk.{layer}.attn_q.weight" in names
        if attention != (kind == "full_attention"):
            held = "attention" if attention else "a recurrent layer"
            raise ValueError(f"blk.{layer} holds {held} but the metadata ({arch}'s layer "
                             f"kinds) makes it {kind}")
        experts = f"blk.{layer}.ffn_gate_inp.weight" in names
        if dense is not None and experts != (layer >= dense):
            held = "experts" if experts else "a dense MLP"
            raise ValueError(f"blk.{layer} holds {held} but metadata "
                             f"{arch}.leading_dense_block_count is {dense}")


def _lfm2moe(reader: Any, arch: str, need) -> dict[str, Any]:
    """llama.cpp's converter writes no top-k normalisation and no routed scaling for
    LFM2-MoE; llama.cpp renormalises and scales by expert_weights_scale where a file has it
    (1 otherwise), as the released LFM2-MoE configs do: so does Folio."""
    gating = field(reader, f"{arch}.expert_gating_func")
    if gating not in (None, 2):   # llama.cpp's LLAMA_EXPERT_GATING_FUNC_TYPE_SIGMOID
        raise ValueError(f"metadata {arch}.expert_gating_func is {gating}: LFM2-MoE's "
                         "router is a sigmoid (2)")
    scale = field(reader, f"{arch}.expert_weights_scale", 1.0)
    return {"num_experts": need("expert_count"),
            "num_experts_per_tok": need("expert_used_count"),
            "moe_intermediate_size": need("expert_feed_forward_length"),
            "num_dense_layers": field(reader, f"{arch}.leading_dense_block_count", 0),
            "norm_topk_prob": True, "routed_scaling_factor": float32_decimal(scale),
            "use_expert_bias": any(t.name.endswith("exp_probs_b.bias")
                                   for t in reader.tensors)}


def _lfm2(reader: Any, arch: str, need, common: dict[str, Any]) -> dict[str, Any]:
    kv_heads = need("attention.head_count_kv")
    kv_heads = kv_heads if isinstance(kv_heads, list) else [kv_heads] * common[
        "num_hidden_layers"]
    if len(kv_heads) != common["num_hidden_layers"]:
        raise ValueError(f"metadata {arch}.attention.head_count_kv lists {len(kv_heads)} "
                         f"layers; block_count is {common['num_hidden_layers']}")
    conv_bias = any(t.name.endswith("shortconv.in_proj.bias") for t in reader.tensors)
    return {"num_key_value_heads": max(kv_heads),
            "layer_types": ["full_attention" if heads else "conv" for heads in kv_heads],
            "head_dim": common["hidden_size"] // common["num_attention_heads"],
            "norm_eps": common["rms_norm_eps"], "conv_L_cache": need("shortconv.l_cache"),
            "conv_bias": conv_bias,
            "block_auto_adjust_ff_dim": False}   # the file's width is the final one


def _qwen35(reader: Any, arch: str, need, common: dict[str, Any]) -> dict[str, Any]:
    mtp = field(reader, f"{arch}.nextn_predict_layers", 0)
    layers = need("block_count") - mtp
    if layers < 1:
        raise ValueError(f"metadata {arch}.nextn_predict_layers ({mtp}) leaves no layer of "
                         f"the {need('block_count')} in block_count")
    recurrent = field(reader, RECURRENT_LAYERS.format(arch=arch))
    if recurrent is not None:
        if len(recurrent) < layers:
            raise ValueError(f"metadata {RECURRENT_LAYERS.format(arch=arch)} lists "
                             f"{len(recurrent)} layers for {layers}")
        types = ["linear_attention" if r else "full_attention" for r in recurrent[:layers]]
    else:
        interval = field(reader, f"{arch}.full_attention_interval", 4)
        types = ["full_attention" if (i + 1) % interval == 0 else "linear_attention"
                 for i in range(layers)]
    head_dim = need("attention.key_length")
    v_heads = need("ssm.time_step_rank")
    inner = need("ssm.inner_size")
    if inner % v_heads:
        raise ValueError(f"metadata {arch}.ssm.inner_size ({inner}) is not a multiple of "
                         f"{arch}.ssm.time_step_rank ({v_heads})")
    rotary = field(reader, f"{arch}.rope.dimension_count", head_dim)
    return {"num_hidden_layers": layers, "layer_types": types, "head_dim": head_dim,
            "linear_conv_kernel_dim": need("ssm.conv_kernel"),
            "linear_key_head_dim": need("ssm.state_size"),
            "linear_num_key_heads": need("ssm.group_count"),
            "linear_num_value_heads": v_heads, "linear_value_head_dim": inner // v_heads,
            "rope_parameters": {"rope_type": "default", "rope_theta": common["rope_theta"],
                                "partial_rotary_factor": rotary / head_dim}}
