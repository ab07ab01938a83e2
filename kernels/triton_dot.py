"""The one tl.dot wrapper every Folio Triton kernel multiplies with."""

from __future__ import annotations

import triton
import triton.language as tl


@triton.jit
def dot_f32(a, b, PRECISION: tl.constexpr, UPCAST: tl.constexpr):
    """a @ b accumulated in float32. UPCAST works around triton's CPU interpreter, whose dot
    multiplies bfloat16 operands as their raw 16-bit patterns (triton 3.9); unused on GPUs."""
    if UPCAST:
        return tl.dot(a.to(tl.float32), b.to(tl.float32), input_precision=PRECISION)
    return tl.dot(a, b, input_precision=PRECISION)
