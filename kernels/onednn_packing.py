"""Which weight dtypes oneDNN can prepack on this CPU (executor/linear.py's PackedLinear and
kernels/moe_cpu.py's experts): float32 anywhere; bfloat16 only with AVX-512 (BW, VL, DQ) or
AVX-NE-CONVERT, oneDNN's own rule (`_reorder_linear_weight` raises without them, e.g. on an
AVX2-only CPU). Elsewhere bfloat16 weights stay plain tensors for torch's matmuls."""

from __future__ import annotations

import torch


def _bfloat16_packable() -> bool:
    if torch.cpu._is_avx512_supported():
        return True
    try:
        with open("/proc/cpuinfo") as info:
            return any("avx_ne_convert" in line.split() for line in info
                       if line.startswith("flags"))
    except OSError:
        return False


def onednn_packs(dtype: torch.dtype) -> bool:
    """Asked when layers are built (it may read /proc/cpuinfo): callers keep the answer."""
    if dtype == torch.float32:
        return True
    return dtype == torch.bfloat16 and _bfloat16_packable()
