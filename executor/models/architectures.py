"""Every architecture Folio serves, declared once (no torch import here: the command line's
checks read configs before any process starts).

Each one is the shared decoder (executor/models/decoder.py) with the options its config
switches on. An entry says how it differs from Llama when its config.json is read
(executor/models/hf_config.py) and how its checkpoint names map onto Folio's
(executor/models/weight_names.py).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from folio.executor.models.hybrid.moe_config import (LFM2_MOE_DEFAULTS, QWEN3_5_MOE_DEFAULTS,
                                                     QWEN3_NEXT_DEFAULTS)
from folio.executor.models.gemma4.spec import DEFAULTS as GEMMA4_DEFAULTS
from folio.executor.models.weight_names import WeightNames


@dataclass(frozen=True)
class Architecture:
    qkv_bias: bool | None = None        # None: the config's attention_bias
    o_bias: bool | None = None
    qk_norm: bool = False
    gemma: bool = False
    windows: str = "all"                # "all", "none", "qwen" (use_sliding_window),
                                        # "gemma2", "gemma3" or "olmo3" (when the config
                                        # has no layer_types)
    moe: str | None = None              # "mixtral", "qwen3_moe", "gpt_oss"; the hybrids':
                                        # "qwen3_next", "qwen3_5_moe", "lfm2_moe"
    partial_rotary: bool = False
    head_dim: int | None = None         # transformers' default when the config has none
    softcaps: tuple[float | None, float | None] = (None, None)   # defaults: attention, final
    window: int | None = None           # sliding_window when the config has none
    hybrid: str | None = None           # recurrent layers: executor/models/hybrid/spec.py
    weights: WeightNames = field(default_factory=WeightNames)
    # The attention-only families of issue 39 (SmolLM3, OLMo 3, gpt-oss):
    no_rope_layers: bool = False        # SmolLM3: no_rope_layers[i] == 0 turns rotary off
    norms: str = "pre"                  # "pre" (Llama) or "post" (OLMo 2/3: norm each
                                        # sublayer's output before the residual add)
    qk_norm_whole: bool = False         # OLMo: q/k norms over all heads at once
    sinks: bool = False                 # gpt-oss: a learned logit per head in the softmax
    scaling_on_full_only: bool = False  # OLMo 3: a flat rope_scaling is the global layers'
    mxfp4_experts: bool = False         # gpt-oss: *_blocks/*_scales experts, dequantized
    gemma4: bool = False                # executor/models/gemma4/: per-layer heads, shared KV
    # transformers' class defaults that config.json leaves out when they hold.
    defaults: tuple[tuple[str, object], ...] = ()


ARCHITECTURES = {
    "LlamaForCausalLM": Architecture(windows="none"),
    "MistralForCausalLM": Architecture(),
    "Qwen2ForCausalLM": Architecture(qkv_bias=True, o_bias=False, windows="qwen"),
    "Qwen3ForCausalLM": Architecture(qk_norm=True, windows="qwen", head_dim=128),
    "Qwen3MoeForCausalLM": Architecture(qk_norm=True, windows="qwen", moe="qwen3_moe",
                                        head_dim=128),
    "MixtralForCausalLM": Architecture(
        moe="mixtral", weights=WeightNames(renames=(("block_sparse_moe.", "mlp."),))),
    "Phi3ForCausalLM": Architecture(qkv_bias=False, o_bias=False, partial_rotary=True),
    "Gemma2ForCausalLM": Architecture(gemma=True, windows="gemma2", head_dim=256,
                                      softcaps=(50.0, 30.0), window=4096),
    "Gemma3ForCausalLM": Architecture(gemma=True, qk_norm=True, windows="gemma3",
                                      head_dim=256, window=4096),
    # Issue 39, the attention-only families (every layer keeps a KV cache).
    "SmolLM3ForCausalLM": Architecture(
        windows="qwen", no_rope_layers=True,
        defaults=(("tie_word_embeddings", True), ("rope_theta", 2000000.0))),
    "Olmo3ForCausalLM": Architecture(
        qk_norm=True, qk_norm_whole=True, norms="post", scaling_on_full_only=True,
        windows="olmo3",
        defaults=(("rms_norm_eps", 1e-5), ("rope_theta", 500000.0), ("sliding_window", 4096))),
    "GptOssForCausalLM": Architecture(
        sinks=True, moe="gpt_oss", mxfp4_experts=True, head_dim=64, windows="gemma2",
        weights=WeightNames(renames=(("mlp.experts.gate_up_proj_bias", "mlp.w13_bias"),
                                     ("mlp.experts.down_proj_bias", "mlp.w2_bias"),
                                     ("mlp.experts.gate_up_proj", "mlp.w13"),
                                     ("mlp.experts.down_proj", "mlp.w2"))),
        defaults=(("rms_norm_eps", 1e-5), ("rope_theta", 150000.0), ("sliding_window", 128),
                  ("attention_bias", True))),
    "Gemma4ForCausalLM": Architecture(gemma=True, qk_norm=True, windows="gemma3",
                                      head_dim=256, window=512, softcaps=(None, None),
                                      gemma4=True, defaults=GEMMA4_DEFAULTS),
    # Hybrids: recurrent-state layers beside attention (executor/models/hybrid/).
    "Qwen3_5ForCausalLM": Architecture(qkv_bias=False, o_bias=False, qk_norm=True,
                                       windows="none", partial_rotary=True,
                                       head_dim=256, hybrid="qwen3_5"),
    "Lfm2ForCausalLM": Architecture(qkv_bias=False, o_bias=False, qk_norm=True,
                                    windows="none", hybrid="lfm2"),
    # Their MoE variants (executor/models/hybrid/moe.py); Qwen3-Next's layers are Qwen3.5's.
    "Qwen3_5MoeForCausalLM": Architecture(
        qkv_bias=False, o_bias=False, qk_norm=True, windows="none", partial_rotary=True,
        head_dim=256, hybrid="qwen3_5", moe="qwen3_5_moe", defaults=QWEN3_5_MOE_DEFAULTS),
    "Qwen3NextForCausalLM": Architecture(
        qkv_bias=False, o_bias=False, qk_norm=True, windows="none", partial_rotary=True,
        head_dim=256, hybrid="qwen3_5", moe="qwen3_next", defaults=QWEN3_NEXT_DEFAULTS),
    "Lfm2MoeForCausalLM": Architecture(qkv_bias=False, o_bias=False, qk_norm=True,
                                       windows="none", hybrid="lfm2", moe="lfm2_moe",
                                       defaults=LFM2_MOE_DEFAULTS),
}

SUPPORTED_ARCHITECTURES = tuple(ARCHITECTURES)
