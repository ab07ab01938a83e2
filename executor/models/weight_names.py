"""Where each checkpoint tensor goes in Folio's model (no torch import here).

Folio stores q/k/v and gate/up fused and each layer's experts stacked; a checkpoint's names
map onto those places, after an architecture's own renames (executor/models/architectures.py).
"""

from __future__ import annotations

import re
from dataclasses import dataclass

# "model." absent in a base model's checkpoint (Qwen3Model: an embedding model).
_LAYER = re.compile(r"^(?:model\.)?layers\.(\d+)\.(.+)$")
# Checkpoint modules that Folio stores fused: (fused module, its slice in order).
_FUSED = {
    "self_attn.q_proj": ("self_attn.qkv_proj", 0),
    "self_attn.k_proj": ("self_attn.qkv_proj", 1),
    "self_attn.v_proj": ("self_attn.qkv_proj", 2),
    "mlp.gate_proj": ("mlp.gate_up_proj", 0),
    "mlp.up_proj": ("mlp.gate_up_proj", 1),
}
# Slices of each fused module (q, k, v; gate, up).
FUSED_SLICES = {fused: sum(1 for f, _ in _FUSED.values() if f == fused)
                for fused, _ in _FUSED.values()}
# One expert's module -> (stacked parameter, half of w13 or None). Qwen3-MoE names, then
# Mixtral's (w1 gate, w3 up, w2 down).
_EXPERT = re.compile(r"^mlp\.experts\.(\d+)\.(\w+)\.weight$")
_EXPERT_PARTS = {"gate_proj": ("mlp.w13", 0), "up_proj": ("mlp.w13", 1),
                 "down_proj": ("mlp.w2", None), "w1": ("mlp.w13", 0), "w3": ("mlp.w13", 1),
                 "w2": ("mlp.w2", None)}
# Experts already stacked (transformers' in-memory layout), same row order as w13 / w2.
_STACKED = {"mlp.experts.gate_up_proj": "mlp.w13", "mlp.experts.down_proj": "mlp.w2"}

# (Folio parameter, expert index or None, fused slice or None); None: not a weight.
Target = tuple[str, int | None, int | None]


@dataclass(frozen=True)
class WeightNames:
    """Maps a checkpoint tensor name to its place in Folio's model."""

    renames: tuple[tuple[str, str], ...] = ()   # layer-relative prefix -> Folio's

    def target(self, name: str) -> Target | None:
        if name.endswith("rotary_emb.inv_freq"):
            return None
        if name.startswith("lm_head."):
            return name, None, None
        match = _LAYER.match(name)
        if match is None:
            return name.removeprefix("model."), None, None
        index, rest = match.groups()
        for old, new in self.renames:
            if rest.startswith(old):
                rest = new + rest[len(old):]
        prefix = f"layers.{index}."
        expert = _EXPERT.match(rest)
        if expert is not None and expert.group(2) in _EXPERT_PARTS:
            param, part = _EXPERT_PARTS[expert.group(2)]
            return prefix + param, int(expert.group(1)), part
        if rest in _STACKED:
            return prefix + _STACKED[rest], None, None
        module, _, leaf = rest.rpartition(".")
        if module in _FUSED:
            fused, part = _FUSED[module]
            return f"{prefix}{fused}.{leaf}", None, part
        return prefix + rest, None, None
