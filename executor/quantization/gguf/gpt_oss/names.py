"""A gpt-oss GGUF file's tensor names -> the Hugging Face checkpoint's (no torch import).

The converter writes the sinks as `attn_sinks.weight` (the checkpoint's `self_attn.sinks`
has no suffix), the router as `ffn_gate_inp` and the stacked experts' gate and up as two
tensors (`ffn_gate_exps`, `ffn_up_exps`) that gguf/gpt_oss/weights.py fuses back into
`gate_up_proj`."""

from __future__ import annotations

from folio.executor.quantization.gguf.layer_names import LAYER, renamed

ARCH = "gpt-oss"
GLOBAL_NAMES = {"token_embd.weight": "model.embed_tokens.weight",
                "output_norm.weight": "model.norm.weight", "output.weight": "lm_head.weight"}
LAYER_NAMES = {
    "attn_norm.weight": "input_layernorm.weight",
    "post_attention_norm.weight": "post_attention_layernorm.weight",
    **{f"attn_{gguf}.{kind}": f"self_attn.{hf}_proj.{kind}"
       for gguf, hf in (("q", "q"), ("k", "k"), ("v", "v"), ("output", "o"))
       for kind in ("weight", "bias")},
    "attn_sinks.weight": "self_attn.sinks",
    "ffn_gate_inp.weight": "mlp.router.weight", "ffn_gate_inp.bias": "mlp.router.bias",
    # the halves of the fused gate_up_proj (weights.py joins them)
    "ffn_gate_exps.weight": "mlp.experts.gate_up_proj",
    "ffn_up_exps.weight": "mlp.experts.gate_up_proj",
    "ffn_gate_exps.bias": "mlp.experts.gate_up_proj_bias",
    "ffn_up_exps.bias": "mlp.experts.gate_up_proj_bias",
    "ffn_down_exps.weight": "mlp.experts.down_proj",
    "ffn_down_exps.bias": "mlp.experts.down_proj_bias"}
# Every layer holds all of them: llama.cpp's gpt-oss loader requires each.
LAYER_NEEDS = tuple(LAYER_NAMES)
# The only tensors a file may hold as MXFP4 (the converter repacks the checkpoint's
# *_blocks / *_scales experts; everything else it writes in the output type).
MXFP4_TENSORS = ("ffn_gate_exps.weight", "ffn_up_exps.weight", "ffn_down_exps.weight")


def gpt_oss_hf_name(gguf_name: str) -> str | None:
    """The Hugging Face name of a tensor; None for one Folio has no place for."""
    return renamed(gguf_name, GLOBAL_NAMES, LAYER_NAMES)


def mxfp4_allowed(gguf_name: str) -> bool:
    match = LAYER.match(gguf_name)
    return match is not None and match.group(2) in MXFP4_TENSORS
