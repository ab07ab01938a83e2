"""rms_norm / fused_add_rms_norm: RMSNorm with an optional residual add, one pass per row.

Meaning: `reference.rms_norm_ref`, rounding included: the residual sum is rounded to the
input dtype before it is normalized (as `x + residual` is in torch), the normalized row is
rounded to the input dtype before the weight multiplies it, and the product is rounded to
torch's promoted dtype of weight and input. One program holds one whole row in registers.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from folio.kernels._checks import (FLOAT_DTYPES, check_inner_contiguous, check_same_device,
                             check_shape, check_tensor)
from folio.kernels._launch import check_launch_device, next_power_of_2, on_device, round_to

_MAX_HIDDEN = 65536


@triton.jit
def _rms_norm_kernel(
    x_ptr, residual_ptr, weight_ptr, out_ptr, residual_out_ptr,
    stride_x, stride_residual, stride_out, stride_residual_out,
    hidden, eps,
    HAS_RESIDUAL: tl.constexpr, BLOCK: tl.constexpr,
):
    row = tl.program_id(0).to(tl.int64)
    cols = tl.arange(0, BLOCK)
    mask = cols < hidden
    dtype = x_ptr.dtype.element_ty
    x = tl.load(x_ptr + row * stride_x + cols, mask=mask, other=0.0).to(tl.float32)
    if HAS_RESIDUAL:
        residual = tl.load(residual_ptr + row * stride_residual + cols, mask=mask, other=0.0)
        x = round_to(x + residual.to(tl.float32), dtype)
        tl.store(residual_out_ptr + row * stride_residual_out + cols, x.to(dtype), mask=mask)
    variance = tl.sum(x * x, 0) / hidden
    normed = round_to(x * tl.math.rsqrt(variance + eps), dtype)
    weight = tl.load(weight_ptr + cols, mask=mask, other=0.0).to(tl.float32)
    result = round_to(weight * normed, out_ptr.dtype.element_ty)
    tl.store(out_ptr + row * stride_out + cols, result.to(out_ptr.dtype.element_ty), mask=mask)


def _as_rows(name: str, tensor: torch.Tensor) -> torch.Tensor:
    """[..., hidden] -> [rows, hidden] view (a copy only if the leading dims do not flatten)."""
    check_inner_contiguous(name, tensor)
    return tensor if tensor.dim() == 2 else tensor.reshape(-1, tensor.shape[-1])


def _rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float,
              residual: torch.Tensor | None) -> tuple[torch.Tensor, torch.Tensor | None]:
    check_tensor("x", x, dtypes=FLOAT_DTYPES)
    check_tensor("weight", weight, ndim=1, dtypes=FLOAT_DTYPES)
    if x.dim() < 1:
        raise ValueError("x must have at least one dimension")
    hidden = x.shape[-1]
    check_shape("weight", weight, (hidden,))
    if not 1 <= hidden <= _MAX_HIDDEN:
        raise ValueError(f"x hidden size must be in [1, {_MAX_HIDDEN}], got {hidden}")
    if isinstance(eps, bool) or not isinstance(eps, (int, float)) or not eps >= 0:
        raise TypeError(f"eps must be a non-negative float, got {eps!r}")
    if residual is not None:
        check_tensor("residual", residual, dtypes=(x.dtype,))
        check_shape("residual", residual, x.shape)
        check_same_device("x", x, weight=weight, residual=residual)
    else:
        check_same_device("x", x, weight=weight)
    check_inner_contiguous("weight", weight)
    check_launch_device("x", x, _rms_norm_kernel)

    out = torch.empty(x.shape, dtype=torch.promote_types(weight.dtype, x.dtype), device=x.device)
    residual_out = torch.empty_like(x) if residual is not None else None
    if x.numel() == 0:
        return out, residual_out
    x_rows = _as_rows("x", x)
    residual_rows = _as_rows("residual", residual) if residual is not None else x_rows
    out_rows = out.view(-1, hidden)
    residual_out_rows = residual_out.view(-1, hidden) if residual_out is not None else out_rows
    block = next_power_of_2(hidden)
    with on_device(x):
        _rms_norm_kernel[(x_rows.shape[0],)](
            x_rows, residual_rows, weight, out_rows, residual_out_rows,
            x_rows.stride(0), residual_rows.stride(0), out_rows.stride(0),
            residual_out_rows.stride(0),
            hidden, float(eps),
            HAS_RESIDUAL=residual is not None, BLOCK=block,
            num_warps=min(16, max(1, block // 256)),
        )
    return out, residual_out


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float,
             residual: torch.Tensor | None = None
             ) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
    """RMSNorm over the last dim of x [..., hidden]; with `residual`, first x += residual and
    return (normed, x + residual). New tensors; the inputs are not modified."""
    out, residual_out = _rms_norm(x, weight, eps, residual)
    return out if residual_out is None else (out, residual_out)


def fused_add_rms_norm(x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor,
                       eps: float) -> tuple[torch.Tensor, torch.Tensor]:
    """(rms_norm(x + residual), x + residual) in one pass over memory."""
    if residual is None:
        raise TypeError("residual must be a torch.Tensor, got NoneType")
    out, residual_out = _rms_norm(x, weight, eps, residual)
    return out, residual_out
