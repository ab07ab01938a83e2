"""Python faces of the fused CPU operators in kernels/cpu/fused_ops.cpp.

Each has the meaning of its torch reference in kernels.reference (rms_norm_ref, rotary_ref);
they are built and loaded with the attention operator
(kernels.cpu_attention), so `cpu_attention.load().ok` says whether they can run.
"""

from __future__ import annotations

import torch


def rms_norm_cpu(x: torch.Tensor, weight: torch.Tensor, eps: float,
                 residual: torch.Tensor | None = None
                 ) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
    """As rms_norm_ref. With `residual`, x and residual are updated in place (x becomes the
    normed sum, residual the sum), which is what the decoder layer does with them next."""
    if residual is None:
        out = torch.empty_like(x)
        torch.ops.folio.rms_norm(out, x, weight, float(eps))
        return out
    torch.ops.folio.fused_add_rms_norm(x, residual, weight, float(eps))
    return x, residual


def rotary_cpu(positions: torch.Tensor, query: torch.Tensor, key: torch.Tensor,
               cos_sin_cache: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """As rotary_ref, rotating query and key in place."""
    torch.ops.folio.rotary(positions, query, key, cos_sin_cache)
    return query, key
