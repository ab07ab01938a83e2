"""What config.json says about the hybrid MoE families' experts (no torch import here: the
command line's checks read configs before any process starts), as transformers 5.24 reads
it (Qwen3NextConfig, Qwen3_5MoeTextConfig, Lfm2MoeConfig):

| | scores | top-k weights | dense layers | shared expert |
|---|---|---|---|---|
| Qwen3-Next | softmax (float32) | renormalised if norm_topk_prob | mlp_only_layers, decoder_sparse_step | sigmoid-gated |
| Qwen3.5-MoE | softmax (float32) | always renormalised | none | sigmoid-gated |
| LFM2-MoE | sigmoid | chosen by score + expert_bias; renormalised (+1e-6) if norm_topk_prob; x routed_scaling_factor | the first num_dense_layers | none |
"""

from __future__ import annotations

from typing import Any

from folio.executor.model_config import MoeConfig

# transformers' class defaults that config.json may leave out (Architecture.defaults).
QWEN3_NEXT_DEFAULTS = (
    ("vocab_size", 151936), ("hidden_size", 2048), ("intermediate_size", 5632),
    ("num_hidden_layers", 48), ("num_attention_heads", 16), ("num_key_value_heads", 2),
    ("max_position_embeddings", 32768), ("partial_rotary_factor", 0.25),
    ("num_experts", 512), ("num_experts_per_tok", 10), ("moe_intermediate_size", 512),
    ("shared_expert_intermediate_size", 512), ("norm_topk_prob", True),
    ("decoder_sparse_step", 1))
QWEN3_5_MOE_DEFAULTS = (
    ("vocab_size", 248320), ("hidden_size", 2048), ("num_hidden_layers", 40),
    ("num_attention_heads", 16), ("num_key_value_heads", 2),
    ("max_position_embeddings", 32768), ("partial_rotary_factor", 0.25),
    ("num_experts", 256), ("num_experts_per_tok", 8), ("moe_intermediate_size", 512),
    ("shared_expert_intermediate_size", 512))
LFM2_MOE_DEFAULTS = (
    ("vocab_size", 65536), ("hidden_size", 2048), ("intermediate_size", 7168),
    ("num_hidden_layers", 32), ("num_attention_heads", 32), ("num_key_value_heads", 8),
    ("max_position_embeddings", 128000), ("rope_theta", 1000000.0),
    ("tie_word_embeddings", True), ("num_experts", 32), ("num_experts_per_tok", 4),
    ("moe_intermediate_size", 1792), ("num_dense_layers", 2), ("use_expert_bias", True),
    ("routed_scaling_factor", 1.0), ("norm_topk_prob", True))

# Released as a vision-language wrapper whose text model Folio serves: its config.json nests
# the text model's config under text_config (the weights under model.language_model.).
_TEXT_OF = {"Qwen3_5MoeForConditionalGeneration": "Qwen3_5MoeForCausalLM",
            "Qwen3_5ForConditionalGeneration": "Qwen3_5ForCausalLM"}


def text_model_raw(raw: dict[str, Any]) -> dict[str, Any]:
    """A wrapper's nested text_config as the text model's own config.json (what the wrapper
    sets at its top level and the text part leaves out is kept); other configs as given."""
    architectures = raw.get("architectures") or []
    if not architectures or architectures[0] not in _TEXT_OF:
        return raw
    text = raw.get("text_config")
    if not isinstance(text, dict):
        raise ValueError(f"{architectures[0]}: config.json has no text_config to serve")
    inherited = {key: raw[key] for key in ("tie_word_embeddings", "eos_token_id", "dtype",
                                           "torch_dtype") if key in raw}
    return {**inherited, **text, "architectures": [_TEXT_OF[architectures[0]]]}


def hybrid_moe(kind: str, raw: dict[str, Any], num_layers: int) -> MoeConfig | None:
    """The experts of a "qwen3_next", "qwen3_5_moe" or "lfm2_moe" config; None when it has
    none (Qwen3-Next with num_experts 0 is dense). ValueError names what does not fit."""
    name = {"qwen3_next": "Qwen3NextForCausalLM", "qwen3_5_moe": "Qwen3_5MoeForCausalLM",
            "lfm2_moe": "Lfm2MoeForCausalLM"}[kind]
    if raw.get("attention_bias"):
        raise ValueError(f"attention_bias true is not supported for {name}")
    experts, top_k = int(raw["num_experts"]), int(raw["num_experts_per_tok"])
    if kind == "qwen3_next" and experts == 0:
        return None
    if not 1 <= top_k <= experts:
        raise ValueError(f"num_experts_per_tok ({top_k}) must be between 1 and the number "
                         f"of experts ({experts})")
    inter = int(raw["moe_intermediate_size"])
    if kind == "lfm2_moe":
        first = int(raw["num_dense_layers"])
        renormalize = bool(raw["norm_topk_prob"])
        return MoeConfig(experts, top_k, inter, renormalize,
                         tuple(i >= first for i in range(num_layers)), scoring="sigmoid",
                         expert_bias=bool(raw["use_expert_bias"]),
                         routed_scaling=float(raw["routed_scaling_factor"]),
                         renorm_eps=1e-6 if renormalize else 0.0)
    if kind == "qwen3_5_moe":
        sparse, renormalize = (True,) * num_layers, True
    else:
        step = int(raw.get("decoder_sparse_step") or 1)
        dense = set(raw.get("mlp_only_layers") or ())
        sparse = tuple(i not in dense and (i + 1) % step == 0 for i in range(num_layers))
        renormalize = bool(raw["norm_topk_prob"])
    return MoeConfig(experts, top_k, inter, renormalize, sparse, round_weights=True,
                     shared_expert_size=int(raw["shared_expert_intermediate_size"]))


def active_width(raw: dict[str, Any]) -> int:
    """Qwen3.5-MoE has no dense MLP (no intermediate_size): the feed-forward width one token
    runs through, top-k experts plus the shared one, stands in for it where Folio sizes
    buffers and times the matmul it costs a step by."""
    return (int(raw["num_experts_per_tok"]) * int(raw["moe_intermediate_size"])
            + int(raw["shared_expert_intermediate_size"]))
