"""Argument checks shared by the Triton launchers (torch only, no triton import).

Each check names the offending argument: TypeError for a wrong kind or dtype, ValueError for
a wrong shape, device or layout. The launchers check everything that can be checked without
reading device memory (a device-to-host sync); values such as slot ids and block ids are the
caller's responsibility.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

import torch

FLOAT_DTYPES = (torch.float32, torch.float16, torch.bfloat16)
INDEX_DTYPES = (torch.int32, torch.int64)
# KV caches stored quantized (kernels/kv_quant.py): int8 rows with a float16 scale, float8.
KV_QUANTIZED_DTYPES = (torch.int8,) + tuple(
    getattr(torch, name) for name in ("float8_e4m3fn", "float8_e5m2") if hasattr(torch, name))


def _dtype_names(dtypes: Iterable[torch.dtype]) -> str:
    return ", ".join(str(d).removeprefix("torch.") for d in dtypes)


def check_tensor(name: str, value: object, *, ndim: int | None = None,
                 dtypes: Sequence[torch.dtype] | None = None) -> torch.Tensor:
    """`value` is a tensor with `ndim` dimensions and one of `dtypes`."""
    if not isinstance(value, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor, got {type(value).__name__}")
    if ndim is not None and value.dim() != ndim:
        raise ValueError(f"{name} must have {ndim} dimensions, got shape {tuple(value.shape)}")
    if dtypes is not None and value.dtype not in dtypes:
        raise TypeError(f"{name} must have dtype in ({_dtype_names(dtypes)}), got "
                        f"{str(value.dtype).removeprefix('torch.')}")
    return value


def check_shape(name: str, value: torch.Tensor, expected: Sequence[int | None]) -> None:
    """Sizes must match `expected`, where None matches anything."""
    ok = value.dim() == len(expected) and all(
        want is None or got == want for got, want in zip(value.shape, expected))
    if not ok:
        shown = tuple("*" if want is None else want for want in expected)
        raise ValueError(f"{name} must have shape {shown}, got {tuple(value.shape)}")


def check_same_device(reference_name: str, reference: torch.Tensor,
                      **others: torch.Tensor) -> None:
    for name, value in others.items():
        if value.device != reference.device:
            raise ValueError(f"{name} is on {value.device} but {reference_name} is on "
                             f"{reference.device}; all arguments must be on one device")


def check_inner_contiguous(name: str, value: torch.Tensor) -> None:
    """The last dimension is packed (stride 1), so rows load as whole vectors."""
    if value.dim() > 0 and value.shape[-1] > 1 and value.stride(-1) != 1:
        raise ValueError(f"{name} must have a contiguous last dimension (stride 1), got "
                         f"strides {value.stride()}")


def check_contiguous(name: str, value: torch.Tensor) -> None:
    if not value.is_contiguous():
        raise ValueError(f"{name} must be contiguous, got shape {tuple(value.shape)} with "
                         f"strides {value.stride()}")
