"""Llama 3.1's rope scaling, back from a GGUF file (no torch import).

llama.cpp's converter does not store Llama 3's rope parameters: it stores their effect, one
divisor per rotary frequency (rope_freqs.weight: 1 for short wavelengths, `factor` for long
ones, a smooth blend between). Those divisors depend on the parameters only through
original_max_position_embeddings / low_freq_factor and / high_freq_factor, so
low_freq_factor = 1 loses nothing; the other two are fitted to the blended divisors, and
the result is checked by recomputing every divisor.
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from typing import Any

import numpy as np

from folio.executor.quantization.gguf.file import float32_decimal


def llama3_rope_parameters(divisors: np.ndarray, theta: float, head_dim: int
                           ) -> dict[str, Any] | None:
    """config.json's rope_parameters for these divisors; None when all are 1 (no scaling);
    ValueError when no Llama 3 scaling gives them."""
    divisors = np.asarray(divisors, dtype=np.float64).reshape(-1)
    if len(divisors) != head_dim // 2:
        raise ValueError(f"rope_freqs.weight has {len(divisors)} factors for head_dim "
                         f"{head_dim} (expected {head_dim // 2})")
    if not np.all(np.isfinite(divisors)) or divisors.min() <= 0:
        raise ValueError("rope_freqs.weight holds factors that are not positive numbers")
    if np.allclose(divisors, 1.0, rtol=1e-6):
        return None
    factor = float(divisors.max())
    wavelen = 2 * math.pi * theta ** (np.arange(0, head_dim, 2) / head_dim)
    for old_len, high in _fits(divisors, factor, wavelen):
        for rounded_high in (round(high, 3), float32_decimal(high)):
            params = {"rope_type": "llama3", "factor": float32_decimal(factor),
                      "low_freq_factor": 1.0, "high_freq_factor": rounded_high,
                      "original_max_position_embeddings": int(round(old_len))}
            if rounded_high > 1 and np.allclose(llama3_divisors(params, wavelen), divisors,
                                                rtol=1e-5):
                return params
    raise ValueError("rope_freqs.weight does not follow Llama 3's rope scaling")


def _fits(divisors: np.ndarray, factor: float, wavelen: np.ndarray
          ) -> Iterator[tuple[float, float]]:
    """Candidate (original length, high_freq_factor) pairs, low_freq_factor being 1."""
    kept = np.isclose(divisors, 1.0, rtol=1e-6)
    slowed = np.isclose(divisors, factor, rtol=1e-6)
    blended = ~kept & ~slowed
    # A blended divisor d: 1/d = (1 - s) / factor + s, s = (old_len / wavelen - 1) / (high - 1).
    smooth = (1 / divisors[blended] - 1 / factor) / (1 - 1 / factor)
    if blended.sum() >= 2:   # s is linear in 1 / wavelen: the fit pins both
        slope, intercept = np.polyfit(1 / wavelen[blended], smooth, 1)
        if intercept < 0:
            high = 1 - 1 / intercept
            yield slope * (high - 1), high
        return
    # Too few blended points to pin both: Llama 3.1's own high_freq_factor first, then any
    # that puts the kept and slowed frequencies on their sides (they give the same rope).
    longest_kept = wavelen[kept].max() if kept.any() else 0.0
    shortest_slowed = wavelen[slowed].min() if slowed.any() else math.inf
    for high in (4.0, 2.0, 8.0, *np.geomspace(1.01, 1024.0, 400)):
        if blended.any():
            yield wavelen[blended][0] * (1 + smooth[0] * (high - 1)), high
        elif high * longest_kept < shortest_slowed and math.isfinite(shortest_slowed):
            yield (math.sqrt(high * longest_kept * shortest_slowed) if longest_kept
                   else shortest_slowed / 2), high


def llama3_divisors(params: dict[str, Any], wavelen: np.ndarray) -> np.ndarray:
    """What executor/rotary.py divides each frequency by for these parameters."""
    old_len, factor = params["original_max_position_embeddings"], params["factor"]
    low, high = params["low_freq_factor"], params["high_freq_factor"]
    smooth = (old_len / wavelen - low) / (high - low)
    blended = 1 / ((1 - smooth) / factor + smooth)
    return np.where(wavelen < old_len / high, 1.0,
                    np.where(wavelen > old_len / low, factor, blended))

