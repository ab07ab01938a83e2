"""A hybrid GGUF file's tensor names -> the Hugging Face checkpoint's (no torch import).

Per layer, the name after `blk.N.`; llama.cpp writes A_log with no suffix (`ssm_a`) and
dt_bias as a bias (`ssm_dt.bias`)."""

from __future__ import annotations

import re

_LFM2_LAYER = {
    "attn_norm.weight": "operator_norm.weight", "ffn_norm.weight": "ffn_norm.weight",
    "attn_q.weight": "self_attn.q_proj.weight", "attn_k.weight": "self_attn.k_proj.weight",
    "attn_v.weight": "self_attn.v_proj.weight",
    "attn_output.weight": "self_attn.out_proj.weight",
    "attn_q_norm.weight": "self_attn.q_layernorm.weight",
    "attn_k_norm.weight": "self_attn.k_layernorm.weight",
    "shortconv.conv.weight": "conv.conv.weight", "shortconv.conv.bias": "conv.conv.bias",
    "shortconv.in_proj.weight": "conv.in_proj.weight",
    "shortconv.in_proj.bias": "conv.in_proj.bias",
    "shortconv.out_proj.weight": "conv.out_proj.weight",
    "shortconv.out_proj.bias": "conv.out_proj.bias",
    "ffn_gate.weight": "feed_forward.w1.weight", "ffn_up.weight": "feed_forward.w3.weight",
    "ffn_down.weight": "feed_forward.w2.weight"}
_QWEN35_LAYER = {
    "attn_norm.weight": "input_layernorm.weight",
    "post_attention_norm.weight": "post_attention_layernorm.weight",
    "attn_q.weight": "self_attn.q_proj.weight", "attn_k.weight": "self_attn.k_proj.weight",
    "attn_v.weight": "self_attn.v_proj.weight", "attn_output.weight": "self_attn.o_proj.weight",
    "attn_q_norm.weight": "self_attn.q_norm.weight",
    "attn_k_norm.weight": "self_attn.k_norm.weight",
    "attn_qkv.weight": "linear_attn.in_proj_qkv.weight",
    "attn_gate.weight": "linear_attn.in_proj_z.weight",
    "ssm_beta.weight": "linear_attn.in_proj_b.weight",
    "ssm_alpha.weight": "linear_attn.in_proj_a.weight",
    "ssm_conv1d.weight": "linear_attn.conv1d.weight", "ssm_dt.bias": "linear_attn.dt_bias",
    "ssm_a": "linear_attn.A_log", "ssm_norm.weight": "linear_attn.norm.weight",
    "ssm_out.weight": "linear_attn.out_proj.weight",
    "ffn_gate.weight": "mlp.gate_proj.weight", "ffn_up.weight": "mlp.up_proj.weight",
    "ffn_down.weight": "mlp.down_proj.weight"}
# Qwen3.5-MoE: Qwen3.5's mixers; experts stacked one tensor per projection ([E, out, in],
# "*" the expert: gguf/hybrid/weights.py yields one tensor per expert, as transformers
# saves them), a router, a shared expert and its gate.
_QWEN35MOE_LAYER = {
    **{key: value for key, value in _QWEN35_LAYER.items() if not key.startswith("ffn_")},
    "ffn_gate_inp.weight": "mlp.gate.weight",
    "ffn_gate_exps.weight": "mlp.experts.*.gate_proj.weight",
    "ffn_up_exps.weight": "mlp.experts.*.up_proj.weight",
    "ffn_down_exps.weight": "mlp.experts.*.down_proj.weight",
    "ffn_gate_inp_shexp.weight": "mlp.shared_expert_gate.weight",
    "ffn_gate_shexp.weight": "mlp.shared_expert.gate_proj.weight",
    "ffn_up_shexp.weight": "mlp.shared_expert.up_proj.weight",
    "ffn_down_shexp.weight": "mlp.shared_expert.down_proj.weight"}
# LFM2-MoE: LFM2's layers; the first leading_dense_block_count keep the dense MLP, the
# rest have a router, stacked experts and the expert bias (float32 in the checkpoint).
_LFM2MOE_LAYER = {
    **_LFM2_LAYER,
    "ffn_gate_inp.weight": "feed_forward.gate.weight",
    "ffn_gate_exps.weight": "feed_forward.experts.*.w1.weight",
    "ffn_up_exps.weight": "feed_forward.experts.*.w3.weight",
    "ffn_down_exps.weight": "feed_forward.experts.*.w2.weight",
    "exp_probs_b.bias": "feed_forward.expert_bias"}
# Qwen3-Next: Qwen3.5-MoE's, but b and a stay fused as the checkpoint's in_proj_ba (the
# model loader splits it); q/k/v and z arrive already split from in_proj_qkvz.
_QWEN3NEXT_LAYER = {
    **{key: value for key, value in _QWEN35MOE_LAYER.items()
       if key not in ("ssm_beta.weight", "ssm_alpha.weight")},
    "ssm_ba.weight": "linear_attn.in_proj_ba.weight"}
LAYER_NAMES = {"lfm2": _LFM2_LAYER, "qwen35": _QWEN35_LAYER, "qwen35moe": _QWEN35MOE_LAYER,
               "lfm2moe": _LFM2MOE_LAYER, "qwen3next": _QWEN3NEXT_LAYER}
GLOBAL_NAMES = {
    "lfm2": {"token_embd.weight": "model.embed_tokens.weight",
             "token_embd_norm.weight": "model.embedding_norm.weight",   # LFM2's final norm
             "output.weight": "lm_head.weight"},
    "qwen35": {"token_embd.weight": "model.embed_tokens.weight",
               "output_norm.weight": "model.norm.weight", "output.weight": "lm_head.weight"}}
GLOBAL_NAMES["qwen35moe"] = GLOBAL_NAMES["qwen35"]
GLOBAL_NAMES["lfm2moe"] = GLOBAL_NAMES["lfm2"]
GLOBAL_NAMES["qwen3next"] = GLOBAL_NAMES["qwen35"]
# The tensors each kind of layer's mixer must hold (a layer holds one kind whole).
MIXER_NEEDS = {
    "lfm2": {"attention": ("attn_q.weight", "attn_k.weight", "attn_v.weight",
                           "attn_output.weight", "attn_q_norm.weight", "attn_k_norm.weight"),
             "conv": ("shortconv.conv.weight", "shortconv.in_proj.weight",
                      "shortconv.out_proj.weight")},
    "qwen35": {"attention": ("attn_q.weight", "attn_k.weight", "attn_v.weight",
                             "attn_output.weight", "attn_q_norm.weight",
                             "attn_k_norm.weight"),
               "linear": ("attn_qkv.weight", "attn_gate.weight", "ssm_beta.weight",
                          "ssm_alpha.weight", "ssm_conv1d.weight", "ssm_dt.bias", "ssm_a",
                          "ssm_norm.weight", "ssm_out.weight")}}
MIXER_NEEDS["qwen35moe"] = MIXER_NEEDS["qwen35"]
MIXER_NEEDS["lfm2moe"] = MIXER_NEEDS["lfm2"]
MIXER_NEEDS["qwen3next"] = {
    "attention": MIXER_NEEDS["qwen35"]["attention"],
    "linear": ("attn_qkv.weight", "attn_gate.weight", "ssm_ba.weight", "ssm_conv1d.weight",
               "ssm_dt.bias", "ssm_a", "ssm_norm.weight", "ssm_out.weight")}
_DENSE = ("ffn_gate.weight", "ffn_up.weight", "ffn_down.weight")
_EXPERTS = ("ffn_gate_inp.weight", "ffn_gate_exps.weight", "ffn_up_exps.weight",
            "ffn_down_exps.weight")
# Likewise each kind of feed-forward, and what every layer holds besides.
FFN_NEEDS = {"lfm2": {"dense": _DENSE}, "qwen35": {"dense": _DENSE},
             "qwen35moe": {"experts": _EXPERTS + (
                 "ffn_gate_inp_shexp.weight", "ffn_gate_shexp.weight", "ffn_up_shexp.weight",
                 "ffn_down_shexp.weight")},
             "lfm2moe": {"dense": _DENSE, "experts": _EXPERTS}}
FFN_NEEDS["qwen3next"] = FFN_NEEDS["qwen35moe"]   # llama.cpp's has experts on every layer
NORM_NEEDS = {"lfm2": ("attn_norm.weight", "ffn_norm.weight"),
              "qwen35": ("attn_norm.weight", "post_attention_norm.weight")}
NORM_NEEDS["qwen35moe"] = NORM_NEEDS["qwen35"]
NORM_NEEDS["lfm2moe"] = NORM_NEEDS["lfm2"]
NORM_NEEDS["qwen3next"] = NORM_NEEDS["qwen35"]
LAYER = re.compile(r"^blk\.(\d+)\.(.+)$")


def hybrid_hf_name(family: str, gguf_name: str) -> str | None:
    """The Hugging Face name of a tensor of a trunk layer or a global one; None for one Folio
    has no place for."""
    if gguf_name in GLOBAL_NAMES[family]:
        return GLOBAL_NAMES[family][gguf_name]
    match = LAYER.match(gguf_name)
    if match is None or match.group(2) not in LAYER_NAMES[family]:
        return None
    return f"model.layers.{match.group(1)}.{LAYER_NAMES[family][match.group(2)]}"


def layer_index(gguf_name: str) -> int | None:
    match = LAYER.match(gguf_name)
    return None if match is None else int(match.group(1))
