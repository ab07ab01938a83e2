"""The weight layout of the AVX-512 BF16 kernel (kernels/cpu/bf16_gemm.cpp), made once at load.

A tile is 16 output rows; within it, each pair of consecutive K values of the 16 rows is one
64-byte load (row-major within the load: row 0's two values, then row 1's, ...), which one
vdpbf16ps multiplies by a pair of x broadcast to every lane. W [N, K] becomes
[tiles, K / 2, 16, 2]; rows past N are zero.
"""

from __future__ import annotations

import functools

import torch

LANES = 16


@functools.cache
def bf16_gemm_available() -> bool:
    """Whether the loaded CPU operators hold the BF16 kernel (a native build on a CPU with
    AVX-512 BF16); callers check that the operators are loaded first."""
    return bool(torch.ops.folio.bf16_gemm_available())


def pack_bf16(weight: torch.Tensor) -> torch.Tensor:
    """W [N, K] (K even) in the kernel's tiles, as bfloat16."""
    n, k = weight.shape
    if k % 2:
        raise ValueError(f"the BF16 kernel needs an even K, got {k}")
    tiles = -(-n // LANES)
    padded = torch.zeros(tiles * LANES, k, dtype=torch.bfloat16, device=weight.device)
    padded[:n] = weight
    return padded.view(tiles, LANES, k // 2, 2).permute(0, 2, 1, 3).contiguous()
