"""What a Gemma 4 text config says beyond the shared ModelConfig, as frozen values (no torch
import here: the command line's checks and the planner read it before any process starts).

Gemma 4's layers are not alike: its global (full-attention) layers have their own head size
and KV-head count, the last num_kv_shared_layers layers read the cache of the last earlier
layer of their type instead of keeping one, and kv-shared layers may have a double-wide MLP.
Its MoE variant (enable_moe_block, e.g. 26B-A4B) runs routed experts beside every layer's
dense MLP.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

# transformers' Gemma4TextConfig class defaults: config.json leaves out a value equal to them.
DEFAULTS = (("head_dim", 256), ("global_head_dim", 512), ("sliding_window", 512),
            ("hidden_size_per_layer_input", 256), ("vocab_size_per_layer_input", 262144),
            ("hidden_activation", "gelu_pytorch_tanh"), ("max_position_embeddings", 131072),
            ("intermediate_size", 9216), ("num_attention_heads", 8),
            ("num_key_value_heads", 4), ("hidden_size", 2304), ("num_hidden_layers", 30),
            ("vocab_size", 262144), ("final_logit_softcapping", None), ("eos_token_id", 1),
            ("rope_parameters", {
                "sliding_attention": {"rope_type": "default", "rope_theta": 10000.0},
                "full_attention": {"rope_type": "proportional", "partial_rotary_factor": 0.25,
                                   "rope_theta": 1000000.0}}))


@dataclass(frozen=True)
class Gemma4Moe:
    """The MoE block every layer runs beside its dense MLP (enable_moe_block)."""

    num_experts: int
    top_k: int
    intermediate_size: int


@dataclass(frozen=True)
class Gemma4Spec:
    layer_heads: tuple[tuple[int, int], ...]   # per layer: (KV heads, head size)
    kv_source: tuple[int, ...]       # per layer: the layer whose cache it reads (itself: owns one)
    k_eq_v: tuple[bool, ...]         # per layer: values are the keys' projection (no v_proj)
    mlp_sizes: tuple[int, ...]       # per layer: the MLP's intermediate size
    per_layer_input_size: int = 0    # per-layer input embeddings (PLE) width; 0: none
    per_layer_vocab: int = 0
    moe: Gemma4Moe | None = None   # enable_moe_block: experts beside every layer's MLP

    @property
    def cache_layers(self) -> tuple[int, ...]:
        """The layers that keep a KV cache, in kv_caches order."""
        return tuple(i for i, source in enumerate(self.kv_source) if source == i)

    @property
    def cache_shapes(self) -> tuple[tuple[int, int], ...]:
        return tuple(self.layer_heads[i] for i in self.cache_layers)

    def cache_index(self, layer: int) -> int:
        """Which kv_caches entry `layer` reads (a shared layer: its source's)."""
        return self.cache_layers.index(self.kv_source[layer])


def _moe(raw: dict[str, Any]) -> Gemma4Moe | None:
    if not raw.get("enable_moe_block"):
        return None
    values = {}
    for key in ("num_experts", "top_k_experts", "moe_intermediate_size"):
        value = raw.get(key)
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ValueError(f"Gemma4 enable_moe_block needs {key} >= 1, got {value!r}")
        values[key] = value
    if values["top_k_experts"] > values["num_experts"]:
        raise ValueError(f"Gemma4 top_k_experts ({values['top_k_experts']}) is more than "
                         f"num_experts ({values['num_experts']})")
    return Gemma4Moe(values["num_experts"], values["top_k_experts"],
                     values["moe_intermediate_size"])


def layer_types(raw: dict[str, Any], num_layers: int) -> list[str]:
    """As transformers' Gemma4TextConfig: config.json's layer_types, else five sliding per
    global layer; the last layer is always global (transformers forces it, warning)."""
    types = list(raw.get("layer_types") or [
        "sliding_attention" if (i + 1) % 6 else "full_attention" for i in range(num_layers)])
    if len(types) != num_layers:
        raise ValueError(f"layer_types has {len(types)} entries for {num_layers} layers")
    types[-1] = "full_attention"
    return types


def parse_gemma4(raw: dict[str, Any], layer_types: list[str], head_dim: int,
                 num_kv_heads: int) -> Gemma4Spec:
    """config.json (with DEFAULTS filled in) -> Gemma4Spec; ValueError names what Folio
    cannot serve."""
    if raw.get("use_bidirectional_attention") == "all":
        raise ValueError("Gemma4 use_bidirectional_attention='all' (an encoder) is not "
                         "supported: Folio serves causal decoders")
    num_layers = len(layer_types)
    k_eq_v = bool(raw.get("attention_k_eq_v", False))
    overrides = _per_layer_overrides(raw, layer_types, k_eq_v)
    heads = tuple((int(overrides.get(i, {}).get("num_key_value_heads", num_kv_heads)),
                   int(overrides.get(i, {}).get("head_dim", head_dim)))
                  for i in range(num_layers))
    for kv, _ in heads:
        if raw["num_attention_heads"] % kv:
            raise ValueError(f"num_attention_heads ({raw['num_attention_heads']}) must be a "
                             f"multiple of every layer's KV heads ({kv})")
    sources = _kv_sources(layer_types, int(raw.get("num_kv_shared_layers") or 0))
    inter = int(raw["intermediate_size"])
    double = bool(raw.get("use_double_wide_mlp", False))
    ple = int(raw.get("hidden_size_per_layer_input") or 0)
    return Gemma4Spec(
        layer_heads=heads, kv_source=sources,
        k_eq_v=tuple(k_eq_v and kind != "sliding_attention" for kind in layer_types),
        mlp_sizes=tuple(inter * (2 if double and sources[i] != i else 1)
                        for i in range(num_layers)),
        per_layer_input_size=ple,
        per_layer_vocab=int(raw.get("vocab_size_per_layer_input") or 0) if ple else 0,
        moe=_moe(raw))


def _per_layer_overrides(raw: dict[str, Any], layer_types: list[str], k_eq_v: bool
                         ) -> dict[int, dict[str, Any]]:
    """Per layer, the head size / KV heads that differ from the config's: config.json's
    per_layer_config when it has one, else transformers' rule (global layers take
    global_head_dim, and num_global_key_value_heads when attention_k_eq_v)."""
    written = raw.get("per_layer_config")
    if isinstance(written, dict):
        return {int(key): dict(value) for key, value in written.items()
                if str(key).isdigit() and isinstance(value, dict)}
    override: dict[str, Any] = {"head_dim": raw["global_head_dim"]}
    if k_eq_v and raw.get("num_global_key_value_heads") is not None:
        override["num_key_value_heads"] = raw["num_global_key_value_heads"]
    return {i: override for i, kind in enumerate(layer_types) if kind == "full_attention"}


def _kv_sources(layer_types: list[str], shared: int) -> tuple[int, ...]:
    """As transformers' kv_sharing_modes: from num_layers - shared on, each layer reads the
    cache of the last earlier non-shared layer of its type."""
    num_layers = len(layer_types)
    first = num_layers - shared
    if shared and first <= 0:
        raise ValueError(f"num_kv_shared_layers ({shared}) leaves no layer that keeps a KV "
                         "cache")
    sources = []
    for i, kind in enumerate(layer_types):
        if i < first:
            sources.append(i)
            continue
        owners = [j for j in range(first) if layer_types[j] == kind]
        if not owners:
            raise ValueError(f"num_kv_shared_layers ({shared}): no earlier {kind} layer "
                             f"keeps a cache for layer {i}")
        sources.append(owners[-1])
    return tuple(sources)
