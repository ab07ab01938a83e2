"""What a hybrid model's config.json says about its recurrent layers, as frozen values (no
torch import here: the command line's checks and the planner read it before any process
starts). One request's recurrent state, over every recurrent layer, is one state slot."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

ATTENTION, LINEAR, CONV = "attention", "linear", "conv"
# config.json's layer_types -> Folio's kind of layer.
_LAYER_KINDS = {"full_attention": ATTENTION, "linear_attention": LINEAR, "conv": CONV}
STATE_DTYPE_BYTES = 4   # the delta rule's key x value matrices are kept in float32


@dataclass(frozen=True)
class HybridSpec:
    family: str                          # "qwen3_5" (Gated DeltaNet) or "lfm2" (short conv)
    layer_kinds: tuple[str, ...]         # per layer: ATTENTION, LINEAR or CONV
    conv_kernel: int                     # the causal convolution's width
    conv_channels: int                   # channels the convolution runs over
    conv_bias: bool = False
    # Gated DeltaNet (LINEAR layers)
    num_k_heads: int = 0
    num_v_heads: int = 0
    k_head_dim: int = 0
    v_head_dim: int = 0

    @property
    def attention_layers(self) -> tuple[int, ...]:
        return tuple(i for i, kind in enumerate(self.layer_kinds) if kind == ATTENTION)

    @property
    def recurrent_layers(self) -> tuple[int, ...]:
        return tuple(i for i, kind in enumerate(self.layer_kinds) if kind != ATTENTION)

    def conv_state_bytes(self, dtype_bytes: int) -> int:
        """One layer's convolution window: the last conv_kernel - 1 inputs of each channel."""
        return self.conv_channels * (self.conv_kernel - 1) * dtype_bytes

    def delta_state_bytes(self) -> int:
        """One LINEAR layer's per-head key x value matrix."""
        return self.num_v_heads * self.k_head_dim * self.v_head_dim * STATE_DTYPE_BYTES

    def state_bytes(self, dtype_bytes: int) -> int:
        """One state slot: every recurrent layer's state for one request."""
        total = 0
        for kind in self.layer_kinds:
            if kind == LINEAR:
                total += self.conv_state_bytes(dtype_bytes) + self.delta_state_bytes()
            elif kind == CONV:
                total += self.conv_state_bytes(dtype_bytes)
        return total


def parse_hybrid(family: str, raw: dict[str, Any], num_layers: int) -> HybridSpec:
    """config.json -> HybridSpec; ValueError names what does not fit."""
    types = raw.get("layer_types")
    if family == "lfm2" and not types:   # older LFM2 configs list the attention layers
        full = set(raw.get("full_attn_idxs") or ())
        types = ["full_attention" if i in full else "conv" for i in range(num_layers)]
    elif not types:   # Qwen3.5: every full_attention_interval-th layer is attention
        interval = int(raw.get("full_attention_interval", 4))
        types = ["full_attention" if (i + 1) % interval == 0 else "linear_attention"
                 for i in range(num_layers)]
    if not types or len(types) != num_layers:
        raise ValueError(f"{family}: layer_types must list each of the {num_layers} layers")
    unknown = sorted(set(types) - set(_LAYER_KINDS))
    if unknown:
        raise ValueError(f"{family}: unsupported layer type(s) {unknown}; Folio serves "
                         f"{', '.join(_LAYER_KINDS)}")
    kinds = tuple(_LAYER_KINDS[t] for t in types)
    if family == "lfm2":
        return HybridSpec("lfm2", kinds, int(raw.get("conv_L_cache", 3)),
                          int(raw["hidden_size"]), bool(raw.get("conv_bias", False)))
    # Absent keys take transformers' Qwen3_5TextConfig defaults.
    k_heads = int(raw.get("linear_num_key_heads", 16))
    v_heads = int(raw.get("linear_num_value_heads", 32))
    if v_heads % k_heads:
        raise ValueError(f"linear_num_value_heads ({v_heads}) must be a multiple of "
                         f"linear_num_key_heads ({k_heads})")
    k_dim = int(raw.get("linear_key_head_dim", 128))
    v_dim = int(raw.get("linear_value_head_dim", 128))
    return HybridSpec("qwen3_5", kinds, int(raw.get("linear_conv_kernel_dim", 4)),
                      2 * k_heads * k_dim + v_heads * v_dim, False, k_heads, v_heads,
                      k_dim, v_dim)


def lfm2_intermediate_size(raw: dict[str, Any]) -> int:
    """LFM2's feed-forward width, adjusted from intermediate_size as transformers does."""
    size = int(raw["intermediate_size"])
    if not raw.get("block_auto_adjust_ff_dim", True):
        return size
    size = int(2 * size / 3)
    multiplier = raw.get("block_ffn_dim_multiplier", 1.0)
    if multiplier is not None:
        size = int(multiplier * size)
        multiple = int(raw.get("block_multiple_of", 256))
        size = multiple * ((size + multiple - 1) // multiple)
    return size
