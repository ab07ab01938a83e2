"""Checkpoint tensors of the hybrid MoE families that do not map one-to-one onto a module of
the same name (hybrid/loader.py copies the rest by name):

- experts, one module per expert (`experts.{e}.gate_proj` / `up_proj` / `down_proj`, LFM2's
  `w1` / `w3` / `w2`: what transformers saves and most releases ship) or already stacked
  (`experts.gate_up_proj` [E, 2I, H], `experts.down_proj` [E, H, I]): into SparseMoe's w13
  (rows 0:I gate, I:2I up) and w2;
- Qwen3-Next's fused Gated DeltaNet projections: `in_proj_qkvz` holds, per key head, its q,
  k, then the v and z of the value heads it serves; `in_proj_ba` likewise b then a. Their
  rows are reordered at load into Qwen3.5's in_proj_qkv / in_proj_z / in_proj_b /
  in_proj_a, so both families run the same layer."""

from __future__ import annotations

import re

import torch

from folio.executor.model_config import ModelConfig

# (parameter name, index into it or None for the whole, the tensor to copy there)
Piece = tuple[str, tuple | None, torch.Tensor]

_EXPERT = re.compile(r"^(layers\.\d+\.(?:mlp|feed_forward))\.experts\.(\d+)\.(\w+)\.weight$")
_STACKED = re.compile(r"^(layers\.\d+\.(?:mlp|feed_forward))\.experts\.(gate_up_proj|down_proj)$")
_FUSED_DELTA = re.compile(r"^(layers\.\d+\.linear_attn)\.in_proj_(qkvz|ba)\.weight$")
_HALF = {"gate_proj": 0, "w1": 0, "up_proj": 1, "w3": 1}


def checkpoint_pieces(name: str, tensor: torch.Tensor, config: ModelConfig
                      ) -> list[Piece] | None:
    """Where `name` (prefix already stripped) goes, in pieces; None: copy it by name."""
    match = _EXPERT.match(name)
    if match is not None and config.moe is not None:
        block, expert, part = match.group(1), int(match.group(2)), match.group(3)
        if part in ("down_proj", "w2"):
            return [(f"{block}.w2", (expert,), tensor)]
        if part in _HALF:
            inter = config.moe.intermediate_size
            rows = slice(_HALF[part] * inter, (_HALF[part] + 1) * inter)
            return [(f"{block}.w13", (expert, rows), tensor)]
        return None
    match = _STACKED.match(name)
    if match is not None:
        stacked = "w13" if match.group(2) == "gate_up_proj" else "w2"
        return [(f"{match.group(1)}.{stacked}", None, tensor)]
    match = _FUSED_DELTA.match(name)
    if match is not None and config.hybrid is not None:
        return _split_fused_delta(match.group(1), match.group(2), tensor, config)
    return None


def _split_fused_delta(prefix: str, which: str, weight: torch.Tensor, config: ModelConfig
                       ) -> list[Piece]:
    spec = config.hybrid
    groups, per_group = spec.num_k_heads, spec.num_v_heads // spec.num_k_heads
    hidden = weight.shape[-1]
    if which == "ba":
        expected = 2 * spec.num_v_heads
        _check_rows(prefix, which, weight, expected)
        grouped = weight.reshape(groups, 2 * per_group, hidden)
        b, a = grouped.split([per_group, per_group], dim=1)
        return [(f"{prefix}.in_proj_b.weight", None, b.reshape(-1, hidden)),
                (f"{prefix}.in_proj_a.weight", None, a.reshape(-1, hidden))]
    k_dim, v_width = spec.k_head_dim, per_group * spec.v_head_dim
    _check_rows(prefix, which, weight, groups * (2 * k_dim + 2 * v_width))
    grouped = weight.reshape(groups, 2 * k_dim + 2 * v_width, hidden)
    q, k, v, z = grouped.split([k_dim, k_dim, v_width, v_width], dim=1)
    qkv = torch.cat([part.reshape(-1, hidden) for part in (q, k, v)])
    return [(f"{prefix}.in_proj_qkv.weight", None, qkv),
            (f"{prefix}.in_proj_z.weight", None, z.reshape(-1, hidden))]


def _check_rows(prefix: str, which: str, weight: torch.Tensor, rows: int) -> None:
    if weight.ndim != 2 or weight.shape[0] != rows:
        raise ValueError(f"{prefix}.in_proj_{which}.weight has shape {tuple(weight.shape)}; "
                         f"the config's linear-attention heads need {rows} rows")
