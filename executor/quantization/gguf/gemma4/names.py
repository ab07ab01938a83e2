"""A Gemma 4 GGUF file's tensor names -> the Hugging Face checkpoint's (no torch import).

llama.cpp's converter (conversion/gemma.py, Gemma4Model) renames every tensor and changes
none of its values: Gemma 4's norms multiply by their weight as it is (norm_shift 0), so
nothing is stored as 1 + w. The router's scale and per-expert scale are written as `.scale`
tensors beside the router and the experts' down projection."""

from __future__ import annotations

from folio.executor.quantization.gguf.layer_names import LAYER, renamed

GLOBAL_NAMES = {
    "token_embd.weight": "model.embed_tokens.weight",
    "output_norm.weight": "model.norm.weight",
    "output.weight": "lm_head.weight",
    "per_layer_token_embd.weight": "model.embed_tokens_per_layer.weight",
    "per_layer_model_proj.weight": "model.per_layer_model_projection.weight",
    "per_layer_proj_norm.weight": "model.per_layer_projection_norm.weight"}
# Per layer, the name after `blk.N.` -> after `model.layers.N.`.
LAYER_NAMES = {
    "attn_norm.weight": "input_layernorm.weight",
    "post_attention_norm.weight": "post_attention_layernorm.weight",
    "ffn_norm.weight": "pre_feedforward_layernorm.weight",
    "post_ffw_norm.weight": "post_feedforward_layernorm.weight",
    "attn_q.weight": "self_attn.q_proj.weight", "attn_k.weight": "self_attn.k_proj.weight",
    "attn_v.weight": "self_attn.v_proj.weight", "attn_output.weight": "self_attn.o_proj.weight",
    "attn_q_norm.weight": "self_attn.q_norm.weight",
    "attn_k_norm.weight": "self_attn.k_norm.weight",
    "ffn_gate.weight": "mlp.gate_proj.weight", "ffn_up.weight": "mlp.up_proj.weight",
    "ffn_down.weight": "mlp.down_proj.weight",
    "layer_output_scale.weight": "layer_scalar",
    # per-layer inputs (PLE)
    "inp_gate.weight": "per_layer_input_gate.weight",
    "proj.weight": "per_layer_projection.weight",
    "post_norm.weight": "post_per_layer_input_norm.weight",
    # the MoE block (enable_moe_block): router, stacked experts, their norms
    "ffn_gate_inp.weight": "router.proj.weight", "ffn_gate_inp.scale": "router.scale",
    "ffn_down_exps.scale": "router.per_expert_scale",
    "ffn_gate_up_exps.weight": "experts.gate_up_proj",
    "ffn_down_exps.weight": "experts.down_proj",
    "pre_ffw_norm_2.weight": "pre_feedforward_layernorm_2.weight",
    "post_ffw_norm_1.weight": "post_feedforward_layernorm_1.weight",
    "post_ffw_norm_2.weight": "post_feedforward_layernorm_2.weight"}
# Read as configuration (the global layers' proportional rope), not a weight.
CONFIG_TENSORS = frozenset({"rope_freqs.weight"})
# What each layer holds whatever its kind; a layer keeping a KV cache adds KV_OWNER.
LAYER_NEEDS = ("attn_norm.weight", "post_attention_norm.weight", "ffn_norm.weight",
               "post_ffw_norm.weight", "attn_q.weight", "attn_output.weight",
               "attn_q_norm.weight", "ffn_gate.weight", "ffn_up.weight", "ffn_down.weight")
KV_OWNER = ("attn_k.weight", "attn_k_norm.weight")
PLE_NEEDS = ("inp_gate.weight", "proj.weight", "post_norm.weight")
MOE_NEEDS = ("ffn_gate_inp.weight", "ffn_gate_inp.scale", "ffn_down_exps.scale",
             "ffn_gate_up_exps.weight", "ffn_down_exps.weight", "pre_ffw_norm_2.weight",
             "post_ffw_norm_1.weight", "post_ffw_norm_2.weight")
# What a layer may hold besides: values (none with attention_k_eq_v), the layer scalar
# (llama.cpp's is optional: 1), and a KV-shared layer's unused k/v (skipped at load, as
# transformers and llama.cpp ignore them).
OPTIONAL = ("attn_v.weight", "layer_output_scale.weight", "attn_k.weight",
            "attn_k_norm.weight")


def gemma4_hf_name(gguf_name: str) -> str | None:
    """The Hugging Face name of a tensor; None for one Folio has no place for."""
    return renamed(gguf_name, GLOBAL_NAMES, LAYER_NAMES)


def layer_part(gguf_name: str) -> tuple[int, str] | None:
    """(layer, name after blk.N.) of a layer's tensor; None for a global one."""
    match = LAYER.match(gguf_name)
    return None if match is None else (int(match.group(1)), match.group(2))
