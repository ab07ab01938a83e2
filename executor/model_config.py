"""The parts of a Hugging Face config.json that Folio's model needs, parsed and checked.

The per-architecture reading lives in executor/models/hf_config.py (no torch there: the
command line's checks read configs before any process starts)."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

# Every architecture Folio builds (executor/models/registry.py holds one entry for each).
SUPPORTED_ARCHITECTURES = (
    "LlamaForCausalLM", "MistralForCausalLM", "Qwen2ForCausalLM", "Qwen3ForCausalLM",
    "Qwen3MoeForCausalLM", "MixtralForCausalLM", "Phi3ForCausalLM", "Gemma2ForCausalLM",
    "Gemma3ForCausalLM",
)

@dataclass(frozen=True)
class RopeConfig:
    theta: float = 10000.0
    rope_type: str = "default"               # "default", "linear", "llama3" or "longrope"
    factor: float = 1.0
    low_freq_factor: float = 1.0
    high_freq_factor: float = 4.0
    original_max_position_embeddings: int = 8192
    # longrope (Phi-3): per-frequency divisors below / above the original length, and the
    # factor transformers multiplies cos and sin by.
    short_factor: tuple[float, ...] = ()
    long_factor: tuple[float, ...] = ()
    attention_factor: float = 1.0


@dataclass(frozen=True)
class MoeConfig:
    num_experts: int
    top_k: int
    intermediate_size: int
    renormalize: bool                        # top-k weights divided by their sum
    sparse_layers: tuple[bool, ...]          # per layer: experts (True) or the dense MLP
    round_weights: bool = False              # top-k weights rounded to the model dtype first


@dataclass(frozen=True)
class ModelConfig:
    architecture: str
    vocab_size: int
    hidden_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    intermediate_size: int
    rms_norm_eps: float
    max_position_embeddings: int
    tie_word_embeddings: bool
    qkv_bias: bool
    o_bias: bool
    mlp_bias: bool
    rope: RopeConfig
    torch_dtype: str
    sliding_window: int | None
    eos_token_ids: tuple[int, ...] = field(default_factory=tuple)
    hidden_act: str = "silu"                 # "silu" or "gelu_tanh" (the gated MLP's gate)
    qk_norm: bool = False                    # per-head RMSNorm on q and k before rotary
    gemma: bool = False                      # (1 + w) norms, sandwich norms, scaled embedding
    query_scale: float | None = None         # attention scale; None: head_dim ** -0.5
    attn_softcap: float | None = None
    final_softcap: float | None = None
    layer_windows: tuple[int | None, ...] = ()   # per layer; () means no layer is windowed
    local_rope: RopeConfig | None = None     # rope of the windowed layers when it differs
    rotary_dim: int | None = None            # partial rotary; None: the whole head
    moe: MoeConfig | None = None

    @property
    def context_limit(self) -> int:
        """The longest context served. A sliding-window model is not capped at its window:
        every attention backend masks (and skips) keys outside each layer's window."""
        return self.max_position_embeddings

    @property
    def attention_scale(self) -> float:
        return self.query_scale if self.query_scale is not None else self.head_dim ** -0.5

    def layer_window(self, layer: int) -> int | None:
        return self.layer_windows[layer] if self.layer_windows else None

    def layer_rope(self, layer: int) -> RopeConfig:
        if self.local_rope is not None and self.layer_window(layer) is not None:
            return self.local_rope
        return self.rope

    def describe(self) -> str:
        """One start-up line, e.g. 'Gemma3ForCausalLM: 26 layers, GQA 8/4, sliding window
        512 on 22 of 26 layers, rope 1e6/1e4'."""
        from folio.executor.models.describe import describe

        return describe(self)

    @classmethod
    def from_dir(cls, model_dir: str | Path) -> "ModelConfig":
        model_dir = Path(model_dir)
        config_path = model_dir / "config.json"
        if not config_path.is_file():
            raise FileNotFoundError(f"no config.json in model directory {model_dir}")
        raw = json.loads(config_path.read_text(encoding="utf-8"))
        generation = model_dir / "generation_config.json"
        gen = json.loads(generation.read_text(encoding="utf-8")) if generation.is_file() else {}
        return cls.from_dict(raw, gen)

    @classmethod
    def from_dict(cls, raw: dict[str, Any], generation: dict[str, Any] | None = None
                  ) -> "ModelConfig":
        from folio.executor.models.hf_config import parse_config

        return parse_config(cls, raw, generation or {})

