"""Attention and normalization kernels: Triton for CUDA, torch references for everywhere."""

from kernels.reference import (paged_attention_ref, reshape_and_cache_ref, rms_norm_ref,
                               rotary_ref)

__all__ = ["paged_attention_ref", "reshape_and_cache_ref", "rms_norm_ref", "rotary_ref"]
