"""Every architecture Folio serves, declared once (no torch import here: the command line's
checks read configs before any process starts).

Each one is the shared decoder (executor/models/decoder.py) with the options its config
switches on. An entry says how it differs from Llama when its config.json is read
(executor/models/hf_config.py) and how its checkpoint names map onto Folio's
(executor/models/weight_names.py).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from folio.executor.models.weight_names import WeightNames


@dataclass(frozen=True)
class Architecture:
    qkv_bias: bool | None = None        # None: the config's attention_bias
    o_bias: bool | None = None
    qk_norm: bool = False
    gemma: bool = False
    windows: str = "all"                # "all", "none", "qwen" (use_sliding_window),
                                        # "gemma2" or "gemma3"
    moe: str | None = None              # "mixtral" or "qwen3_moe"
    partial_rotary: bool = False
    head_dim: int | None = None         # transformers' default when the config has none
    softcaps: tuple[float | None, float | None] = (None, None)   # defaults: attention, final
    window: int | None = None           # sliding_window when the config has none
    hybrid: str | None = None           # recurrent layers: executor/models/hybrid/spec.py
    weights: WeightNames = field(default_factory=WeightNames)


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
    # Hybrids: recurrent-state layers beside attention (executor/models/hybrid/).
    "Qwen3_5ForCausalLM": Architecture(qkv_bias=False, o_bias=False, qk_norm=True,
                                       windows="none", partial_rotary=True,
                                       head_dim=256, hybrid="qwen3_5"),
    "Lfm2ForCausalLM": Architecture(qkv_bias=False, o_bias=False, qk_norm=True,
                                    windows="none", hybrid="lfm2"),
}

SUPPORTED_ARCHITECTURES = tuple(ARCHITECTURES)
