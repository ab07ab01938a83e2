"""The parts of a Hugging Face config.json that Folio's model needs, as frozen values.

executor/models/hf_config.py reads them from a model directory (read_model_config) and
checks them; executor/models/describe.py writes the start-up line."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable

from folio.executor.models.gemma4.spec import Gemma4Spec
from folio.executor.models.hybrid.spec import HybridSpec
from folio.executor.quantization.prequantized_config import PrequantScheme


@dataclass(frozen=True)
class RopeConfig:
    theta: float = 10000.0
    rope_type: str = "default"   # "default", "linear", "llama3", "longrope", "yarn", "proportional"
    factor: float = 1.0
    low_freq_factor: float = 1.0
    high_freq_factor: float = 4.0
    original_max_position_embeddings: int = 8192
    # longrope (Phi-3): per-frequency divisors below / above the original length, and the
    # factor transformers multiplies cos and sin by.
    short_factor: tuple[float, ...] = ()
    long_factor: tuple[float, ...] = ()
    attention_factor: float = 1.0            # longrope and yarn: cos and sin are scaled by it
    # yarn (gpt-oss, OLMo 3): the band of frequencies between beta_fast and beta_slow
    # rotations over the original length is blended from interpolated to kept.
    beta_fast: float = 32.0
    beta_slow: float = 1.0
    truncate: bool = True
    # proportional (Gemma 4's global layers): only this fraction of the head's frequencies
    # turn; the rest have frequency 0 (cos 1, sin 0), the table still spans the whole head.
    proportion: float = 1.0


@dataclass(frozen=True)
class MoeConfig:
    num_experts: int
    top_k: int
    intermediate_size: int
    renormalize: bool                        # top-k weights divided by their sum
    sparse_layers: tuple[bool, ...]          # per layer: experts (True) or the dense MLP
    round_weights: bool = False              # top-k weights rounded to the model dtype first
    # gpt-oss: (alpha, limit) of its clamped SwiGLU, experts with biases, the top-k logits
    # softmaxed (executor/models/gpt_oss/moe.py); None: SparseMoe's experts.
    swiglu: tuple[float, float] | None = None
    # The hybrid MoE families (executor/models/hybrid/moe.py). LFM2-MoE scores each expert
    # by a sigmoid, chooses by score + a learned bias (the bias does not weight), adds
    # renorm_eps to the top-k sum and multiplies by routed_scaling; Qwen3-Next and
    # Qwen3.5-MoE add a shared expert of this width, gated by a sigmoid per token.
    scoring: str = "softmax"                 # "softmax" or "sigmoid"
    expert_bias: bool = False
    routed_scaling: float = 1.0
    renorm_eps: float = 0.0
    shared_expert_size: int = 0              # 0: no shared expert


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
    prequantized: PrequantScheme | None = None   # a pre-quantized checkpoint's scheme
    rope_layers: tuple[bool, ...] = ()       # per layer, rotary on; () means on everywhere
    norms: str = "pre"                       # "pre" (Llama) or "post" (OLMo: see decoder.py)
    qk_norm_whole: bool = False              # q/k norms over all heads at once (OLMo)
    attention_sinks: bool = False            # a learned logit per head (gpt-oss)
    hybrid: HybridSpec | None = None         # recurrent layers beside attention (hybrid/)
    gemma4: Gemma4Spec | None = None         # per-layer head sizes, shared KV, PLE (gemma4/)

    @property
    def context_limit(self) -> int:
        """The longest context served. A sliding-window model is not capped at its window:
        every attention backend masks (and skips) keys outside each layer's window."""
        return self.max_position_embeddings

    @property
    def attention_scale(self) -> float:
        return self.query_scale if self.query_scale is not None else self.head_dim ** -0.5

    def kv_block_bytes(self, block_size: int, row_bytes: int | Callable[[int], int]) -> int:
        """One KV block: K and V of every layer that keeps a cache, as executor/kv_cache.py
        lays them out, summed over their shapes; row_bytes: the bytes of one (token, KV head)
        row of a given head size (shared/kv_cache_dtype.py element_row_bytes), or of
        head_dim's rows where every cache has that size."""
        if not callable(row_bytes):
            if any(dim != self.head_dim for _, dim in self.kv_cache_shapes):
                raise ValueError(f"{self.architecture}: its layers' head sizes differ, so "
                                 "one row size cannot give a block's bytes")
            size = row_bytes
            row_bytes = lambda dim: size   # noqa: E731
        return sum(2 * block_size * heads * row_bytes(dim) for heads, dim in self.kv_cache_shapes)

    @property
    def kv_cache_shapes(self) -> tuple[tuple[int, int], ...]:
        """(KV heads, head size) of each layer's cache, in kv_caches order: one per layer, a
        hybrid's attention layers, or Gemma 4's layers that do not share another's."""
        if self.gemma4 is not None:
            return self.gemma4.cache_shapes
        return ((self.num_kv_heads, self.head_dim),) * self.num_kv_layers

    @property
    def num_kv_layers(self) -> int:
        """Layers with a paged KV cache of their own."""
        if self.gemma4 is not None:
            return len(self.gemma4.cache_layers)
        return len(self.hybrid.attention_layers) if self.hybrid else self.num_layers

    def state_bytes(self, dtype_bytes: int) -> int:
        """One request's recurrent state over every recurrent layer (0: none)."""
        return self.hybrid.state_bytes(dtype_bytes) if self.hybrid else 0

    def layer_window(self, layer: int) -> int | None:
        return self.layer_windows[layer] if self.layer_windows else None

    def layer_rotary(self, layer: int) -> bool:
        return self.rope_layers[layer] if self.rope_layers else True

    def layer_rope(self, layer: int) -> RopeConfig:
        if self.local_rope is not None and self.layer_window(layer) is not None:
            return self.local_rope
        return self.rope
