"""Launch helpers shared by the Triton kernels: where a kernel may run, and device facts."""

from __future__ import annotations

import contextlib
import functools

import torch
import triton
import triton.language as tl


def is_interpreted(kernel: object) -> bool:
    """True when triton built `kernel` for its CPU interpreter (TRITON_INTERPRET=1 at import)."""
    return type(kernel).__name__ == "InterpretedFunction"


def check_launch_device(name: str, tensor: torch.Tensor, kernel: object) -> None:
    """Compiled kernels need CUDA tensors; the interpreter needs CPU tensors."""
    if is_interpreted(kernel):
        if tensor.device.type != "cpu":
            raise ValueError(f"{name} is on {tensor.device}, but triton runs in interpreter "
                             f"mode (TRITON_INTERPRET=1), which needs CPU tensors")
    elif tensor.device.type != "cuda":
        raise ValueError(f"{name} is on {tensor.device}; the Triton kernels need CUDA tensors "
                         f"(or TRITON_INTERPRET=1 set before triton is first imported)")


def on_device(tensor: torch.Tensor) -> contextlib.AbstractContextManager:
    """Triton launches on the current CUDA device: make it the tensor's (cuda:1 and others)."""
    if tensor.device.type == "cuda":
        return torch.cuda.device(tensor.device)
    return contextlib.nullcontext()


@functools.cache
def _sm_count(device_index: int) -> int:
    return torch.cuda.get_device_properties(device_index).multi_processor_count


def multiprocessor_count(device: torch.device) -> int:
    """Streaming multiprocessors on `device`; a small stand-in for the CPU interpreter."""
    if device.type != "cuda":
        return 4
    index = device.index if device.index is not None else torch.cuda.current_device()
    return _sm_count(index)


def next_power_of_2(n: int) -> int:
    return triton.next_power_of_2(max(1, int(n)))


@triton.jit
def round_to(x, DTYPE: tl.constexpr):
    """float32 `x` rounded to DTYPE (to nearest, ties to even), returned as float32.

    torch rounds every bf16/fp16 op to nearest-even; the fused kernels mirror that. bfloat16
    is rounded with integer ops because triton's CPU interpreter truncates fp32 -> bf16 casts
    (triton 3.9) where GPUs round: this way both give the same bits.
    """
    if DTYPE == tl.bfloat16:
        bits = x.to(tl.uint32, bitcast=True)
        bits = (bits + 0x7FFF + ((bits >> 16) & 1)) & 0xFFFF0000
        return tl.where(x != x, x, bits.to(tl.float32, bitcast=True))
    elif DTYPE == tl.float32:
        return x
    else:
        return x.to(DTYPE).to(tl.float32)
