"""Rotary-embedding tables, computed exactly as transformers computes them."""

from __future__ import annotations

import math

import torch

from folio.executor.model_config import RopeConfig


def inverse_frequencies(rope: RopeConfig, head_dim: int, long: bool = False) -> torch.Tensor:
    """`head_dim` is the rotated width (the whole head, or the partial rotary dimension)."""
    exponents = torch.arange(0, head_dim, 2, dtype=torch.float) / head_dim
    if rope.rope_type == "longrope":
        factors = torch.tensor(rope.long_factor if long else rope.short_factor,
                               dtype=torch.float)
        return 1.0 / (factors * rope.theta ** exponents)
    if rope.rope_type == "proportional":
        return _proportional_frequencies(rope, head_dim)
    inv_freq = 1.0 / (rope.theta ** exponents)
    if rope.rope_type == "yarn":
        return _yarn_frequencies(rope, head_dim)
    if rope.rope_type == "linear":
        return inv_freq / rope.factor
    if rope.rope_type == "llama3":
        return _llama3_frequencies(inv_freq, rope)
    return inv_freq


def _llama3_frequencies(inv_freq: torch.Tensor, rope: RopeConfig) -> torch.Tensor:
    # Llama 3.1: long wavelengths are slowed by `factor`, short ones kept, the band between
    # them interpolated smoothly.
    old_len = rope.original_max_position_embeddings
    low_freq_wavelen = old_len / rope.low_freq_factor
    high_freq_wavelen = old_len / rope.high_freq_factor
    wavelen = 2 * math.pi / inv_freq
    scaled = torch.where(wavelen > low_freq_wavelen, inv_freq / rope.factor, inv_freq)
    smooth = (old_len / wavelen - rope.low_freq_factor) / (
        rope.high_freq_factor - rope.low_freq_factor)
    smoothed = (1 - smooth) * scaled / rope.factor + smooth * scaled
    is_medium = ~(wavelen < high_freq_wavelen) * ~(wavelen > low_freq_wavelen)
    return torch.where(is_medium, smoothed, scaled)


def _yarn_frequencies(rope: RopeConfig, dim: int) -> torch.Tensor:
    # Frequencies that turn more than beta_fast times over the original length are kept,
    # fewer than beta_slow times interpolated (divided by factor), a linear ramp between.
    def correction_dim(rotations: float) -> float:
        return (dim * math.log(rope.original_max_position_embeddings
                               / (rotations * 2 * math.pi))) / (2 * math.log(rope.theta))

    low, high = correction_dim(rope.beta_fast), correction_dim(rope.beta_slow)
    if rope.truncate:
        low, high = math.floor(low), math.ceil(high)
    low, high = max(low, 0), min(high, dim - 1)
    if low == high:
        high += 0.001   # as transformers: no division by zero
    ramp = ((torch.arange(dim // 2, dtype=torch.float32) - low) / (high - low)).clamp(0, 1)
    keep = 1 - ramp
    # The same float32 operations as transformers, so the tables agree to the bit.
    wavelengths = rope.theta ** (torch.arange(0, dim, 2, dtype=torch.float) / dim)
    return 1.0 / (rope.factor * wavelengths) * (1 - keep) + 1.0 / wavelengths * keep


def _proportional_frequencies(rope: RopeConfig, head_dim: int) -> torch.Tensor:
    turning = int(rope.proportion * head_dim // 2)
    exponents = torch.arange(0, 2 * turning, 2, dtype=torch.int64).float() / head_dim
    inv_freq = torch.cat((1.0 / rope.theta ** exponents,
                          torch.zeros(head_dim // 2 - turning, dtype=torch.float32)))
    return inv_freq / rope.factor


def rotary_cos_sin_cache(rope: RopeConfig, head_dim: int, max_positions: int,
                         device: torch.device) -> torch.Tensor:
    """[max_positions, head_dim]: cos of each frequency in the first half, sin in the second.

    longrope: [2 * max_positions, head_dim], the short-factor rows, then the long-factor
    rows (see `longrope_positions`), both scaled by the attention factor as transformers
    scales cos and sin."""
    if rope.rope_type == "longrope":
        return torch.cat([_table(inverse_frequencies(rope, head_dim, long), max_positions,
                                 rope.attention_factor) for long in (False, True)]).to(device)
    scale = rope.attention_factor if rope.rope_type == "yarn" else 1.0
    return _table(inverse_frequencies(rope, head_dim), max_positions, scale).to(device)


def _table(inv_freq: torch.Tensor, max_positions: int, scale: float) -> torch.Tensor:
    positions = torch.arange(max_positions, dtype=torch.float)
    freqs = positions[:, None] * inv_freq[None, :]
    if scale == 1.0:
        return torch.cat((freqs.cos(), freqs.sin()), dim=-1)
    return torch.cat((freqs.cos() * scale, freqs.sin() * scale), dim=-1)


def longrope_positions(positions: torch.Tensor, seq_lens: torch.Tensor,
                       query_start_loc: torch.Tensor, original: int, max_positions: int
                       ) -> torch.Tensor:
    """Rows of the longrope table: a sequence whose context (this step included) is longer
    than `original` reads the long-factor rows, as transformers switches to the long factors
    once the sequence it is given passes the original length."""
    counts = (query_start_loc[1:] - query_start_loc[:-1]).long()
    is_long = torch.repeat_interleave(seq_lens > original, counts, output_size=len(positions))
    return positions + is_long.to(positions.dtype) * max_positions
