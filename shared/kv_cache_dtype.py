"""--kv-cache-dtype: the element types the paged KV cache may be stored in, and the bytes one
(token, KV head) row takes in each. Torch-free: `folio simulate` and preflight size pools
with it before torch is imported; kernels/kv_quant.py does the quantizing.

int8 rows are head_dim int8 values followed by their float16 scale (2 bytes): one scale per
(token, KV head), written with the token, so a later token never outgrows an earlier scale
and every per-block path (swap, fork copies, the block mover) moves the scale with its row.
fp8 rows carry no scale: the format has its own exponent, so a scale would only buy range
(e4m3 saturates at +-448, e5m2 at +-57344), not precision.
"""

from __future__ import annotations

KV_CACHE_DTYPES = ("auto", "bfloat16", "int8", "fp8_e4m3", "fp8_e5m2")
QUANTIZED_KV_CACHE_DTYPES = ("int8", "fp8_e4m3", "fp8_e5m2")
INT8_SCALE_BYTES = 2   # one float16 per (token, KV head) row
_ELEMENT_BYTES = {"float32": 4, "float16": 2, "bfloat16": 2, "int8": 1, "fp8_e4m3": 1,
                  "fp8_e5m2": 1}


def kv_element_name(kv_cache_dtype: str, model_dtype: str) -> str:
    """The stored element type: the model's own for auto."""
    if kv_cache_dtype not in KV_CACHE_DTYPES:
        raise ValueError(f"kv_cache_dtype must be one of {', '.join(KV_CACHE_DTYPES)}, got "
                         f"{kv_cache_dtype!r}")
    return model_dtype if kv_cache_dtype == "auto" else kv_cache_dtype


def kv_row_bytes(kv_cache_dtype: str, model_dtype: str, head_dim: int) -> int:
    """Bytes of one (token, KV head) row of K (or V), scale included."""
    return element_row_bytes(kv_element_name(kv_cache_dtype, model_dtype), head_dim)


def element_row_bytes(element: str, head_dim: int) -> int:
    """Bytes of a row stored as `element` (a model dtype or a quantized KV type)."""
    scale = INT8_SCALE_BYTES if element == "int8" else 0
    return head_dim * _ELEMENT_BYTES[element] + scale
