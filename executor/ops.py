"""The kernel set a model runs with: torch references, or Triton kernels on CUDA."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable

import torch

from kernels import reference


@dataclass(frozen=True)
class AttentionInputs:
    """One step's attention metadata, shared by every layer."""

    slot_mapping: torch.Tensor        # [T] flat cache slot of each new token
    block_tables: torch.Tensor        # [S, M] int32
    seq_lens: torch.Tensor            # [S] context length including the new tokens
    query_start_loc: torch.Tensor     # [S + 1]
    plan: Any = None                  # backend-specific precomputation


@dataclass(frozen=True)
class KernelOps:
    name: str
    rms_norm: Callable[..., Any]
    rotary: Callable[..., Any]
    reshape_and_cache: Callable[..., Any]
    attention: Callable[[torch.Tensor, torch.Tensor, torch.Tensor, AttentionInputs, float],
                        torch.Tensor]
    prepare: Callable[[AttentionInputs, int], AttentionInputs]


def _torch_attention(query, key_cache, value_cache, inputs: AttentionInputs, scale):
    return reference.paged_attention_planned(query, key_cache, value_cache, inputs.plan, scale)


def _torch_prepare(inputs: AttentionInputs, block_size: int) -> AttentionInputs:
    plan = reference.plan_attention(inputs.block_tables, inputs.seq_lens, inputs.query_start_loc,
                                    block_size)
    return AttentionInputs(inputs.slot_mapping, inputs.block_tables, inputs.seq_lens,
                           inputs.query_start_loc, plan)


TORCH_OPS = KernelOps(
    name="torch",
    rms_norm=reference.rms_norm_ref,
    rotary=reference.rotary_ref,
    reshape_and_cache=reference.reshape_and_cache_ref,
    attention=_torch_attention,
    prepare=_torch_prepare,
)


def triton_ops() -> KernelOps:
    import kernels  # the Triton kernels load lazily, only here

    def attention(query, key_cache, value_cache, inputs: AttentionInputs, scale):
        return kernels.paged_attention(query, key_cache, value_cache, inputs.block_tables,
                                       inputs.seq_lens, inputs.query_start_loc, scale)

    def rms_norm(x, weight, eps, residual=None):
        if residual is None:
            return kernels.rms_norm(x, weight, eps)
        return kernels.fused_add_rms_norm(x, residual, weight, eps)

    return KernelOps(name="triton", rms_norm=rms_norm, rotary=kernels.rotary_embedding,
                     reshape_and_cache=kernels.reshape_and_cache, attention=attention,
                     prepare=lambda inputs, block_size: inputs)


def select_ops(backend: str, device: torch.device) -> KernelOps:
    if backend == "auto":
        backend = "triton" if device.type == "cuda" else "torch"
    if backend == "torch":
        return TORCH_OPS
    if device.type != "cuda" and not _triton_interpreter_on():
        raise ValueError("attention_backend='triton' needs a CUDA device (or TRITON_INTERPRET=1 "
                         "for testing on CPU); use 'torch' or 'auto' here")
    return triton_ops()


def _triton_interpreter_on() -> bool:
    import os

    return os.environ.get("TRITON_INTERPRET") == "1"
