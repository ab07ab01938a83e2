"""Python face of the C++ segmented LoRA operator (kernels/cpu/lora_segments.cpp): for rows
grouped by adapter slot, out[r] += B_s (A_s x[r]) in place, one call per projection.

Built and loaded with the other CPU operators (kernels.cpu_attention), so
`cpu_attention.load().ok` says whether it can run; the executor's LoRA layers
(executor/lora/layers.py) use the torch matmuls per adapter otherwise.
"""

from __future__ import annotations

import torch


def lora_segments_cpu(x: torch.Tensor, out: torch.Tensor, a: torch.Tensor, bt: torch.Tensor,
                      spans: torch.Tensor, rows: torch.Tensor,
                      groups: torch.Tensor) -> torch.Tensor:
    """x [tokens, in], out [tokens, out] (updated and returned); a [slots, R, in] and
    bt [slots, R, out] (B transposed, scaled); spans int64 [slots, P, 4]: each slot's
    (o0, o1, k0, k1) blocks of B that are not zero; rows int64 [M]: the adapter rows,
    grouped; groups int64 [G, 3]: (slot, start in rows, count)."""
    torch.ops.folio.lora_segments(out, x, a, bt, spans, rows, groups)
    return out
