"""A LoRA adapter's weights, arranged for Folio's fused layers (docs/lora.md).

Folio stores q/k/v as one qkv_proj and gate/up as one gate_up_proj, so an adapter's
q_proj, k_proj and v_proj pairs become one pair per fused module: their A matrices stacked
([r_q + r_k + r_v, in]) and their B matrices block-diagonal ([out, r_q + r_k + r_v]), with
the adapter's scale folded into B. One pair of small matmuls then serves the fused module.
Every check (executor/lora/files.py) runs before any tensor is read: a bad adapter raises
LoraError naming the cause, and nothing of it is kept.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import torch

from folio.executor.lora.files import (WEIGHTS_FILE, LoraError, fused_sizes, plan_adapter,
                                       target_shapes)
from folio.executor.model_config import ModelConfig
from folio.executor.models.weight_names import WeightNames


@dataclass(frozen=True)
class LoraWeights:
    """One adapter's pairs by Folio module path: (A [rank, in], B [out, rank] scaled)."""

    name: str
    path: str
    rank: int   # the largest rank of its modules
    pairs: dict[str, tuple[torch.Tensor, torch.Tensor]]

    def to(self, device: torch.device) -> "LoraWeights":
        if all(a.device == device for a, _ in self.pairs.values()):
            return self
        return LoraWeights(self.name, self.path, self.rank,
                           {k: (a.to(device), b.to(device)) for k, (a, b) in self.pairs.items()})


def read_adapter(name: str, path: str | Path, config: ModelConfig, names: WeightNames,
                 max_rank: int, dtype: torch.dtype) -> LoraWeights:
    from safetensors import SafetensorError
    from safetensors.torch import load_file

    parts = plan_adapter(name, path, config, names, max_rank)
    file = Path(path) / WEIGHTS_FILE
    try:
        tensors = load_file(str(file))
    except (OSError, SafetensorError, ValueError) as error:
        raise LoraError(f"cannot read {str(file)!r}: {error}") from None
    shapes = target_shapes(config)
    by_module: dict[str, dict[int | None, tuple[torch.Tensor, torch.Tensor]]] = {}
    for p in parts:
        a = tensors[p.key_a].to(torch.float32)
        b = tensors[p.key_b].to(torch.float32) * p.scale
        by_module.setdefault(p.module, {})[p.part] = (a, b)
    pairs = {module: _fuse(module, pieces, shapes[module][1], config, dtype)
             for module, pieces in by_module.items()}
    return LoraWeights(name, str(path), max(p.rank for p in parts), pairs)


def _fuse(module: str, pieces: dict[int | None, tuple[torch.Tensor, torch.Tensor]],
          out_size: int, config: ModelConfig, dtype: torch.dtype
          ) -> tuple[torch.Tensor, torch.Tensor]:
    """One (A, B) for a Folio module: A's stacked, B's block-diagonal over the fused slices
    (a slice the adapter leaves alone gets zero rows)."""
    if None in pieces:
        a, b = pieces[None]
        return a.to(dtype).contiguous(), b.to(dtype).contiguous()
    sizes = fused_sizes(module, out_size, config)
    order = sorted(pieces)
    a = torch.cat([pieces[p][0] for p in order])
    b = torch.zeros(out_size, a.shape[0])
    column = 0
    for p in order:
        piece_a, piece_b = pieces[p]
        row = sum(sizes[:p])
        b[row:row + sizes[p], column:column + piece_a.shape[0]] = piece_b
        column += piece_a.shape[0]
    return a.to(dtype).contiguous(), b.to(dtype).contiguous()
