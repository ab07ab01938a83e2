"""The kernel set a model runs with: torch references, the C++ CPU attention operator, or
Triton kernels on CUDA."""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any, Callable

import torch

from folio.kernels import cpu_attention, cpu_fused, moe_reference, reference
from folio.kernels.moe_cpu import CpuFusedMoe

log = logging.getLogger("folio.executor")


@dataclass(frozen=True)
class AttentionInputs:
    """One step's attention metadata, shared by every layer."""

    slot_mapping: torch.Tensor        # [T] flat cache slot of each new token
    block_tables: torch.Tensor        # [S, M] int32
    seq_lens: torch.Tensor            # [S] context length including the new tokens
    query_start_loc: torch.Tensor     # [S + 1]
    plan: Any = None                  # backend-specific precomputation


def _unplanned(inputs: AttentionInputs, block_size: int) -> AttentionInputs:
    return inputs   # kernels that read the block tables as they are


@dataclass(frozen=True)
class KernelOps:
    name: str
    rms_norm: Callable[..., Any]
    rotary: Callable[..., Any]
    reshape_and_cache: Callable[..., Any]
    silu_and_mul: Callable[[torch.Tensor], torch.Tensor]
    # attention(query, key_cache, value_cache, inputs, scale, window=None, softcap=None,
    # sinks=None): window W (per layer): a query at position p sees keys p - W < j <= p;
    # softcap c: scores = c * tanh(scores / c) before the softmax; sinks [H]: one more logit
    # per head in each row's softmax denominator (gpt-oss).
    attention: Callable[..., torch.Tensor]
    prepare: Callable[[AttentionInputs, int], AttentionInputs] = _unplanned
    # MoE experts: (hidden [T,H], w13 [E,2I,H], w2 [E,H,I], topk_weights [T,k], topk_ids [T,k])
    fused_moe: Callable[..., torch.Tensor] = moe_reference.fused_moe_ref


def _torch_attention(query, key_cache, value_cache, inputs: AttentionInputs, scale,
                     window: int | None = None, softcap: float | None = None, sinks=None):
    return reference.paged_attention_planned(query, key_cache, value_cache, inputs.plan, scale,
                                             window=window, softcap=softcap, sinks=sinks)


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
    silu_and_mul=reference.silu_and_mul_ref,
    attention=_torch_attention,
    prepare=_torch_prepare,
    fused_moe=moe_reference.fused_moe_ref,
)


def triton_ops() -> KernelOps:
    from folio import kernels  # the Triton kernels load lazily, only here

    def attention(query, key_cache, value_cache, inputs: AttentionInputs, scale,
                  window: int | None = None, softcap: float | None = None, sinks=None):
        return kernels.paged_attention(query, key_cache, value_cache, inputs.block_tables,
                                       inputs.seq_lens, inputs.query_start_loc, scale,
                                       window=window, softcap=softcap, sinks=sinks)

    def rms_norm(x, weight, eps, residual=None):
        if residual is None:
            return kernels.rms_norm(x, weight, eps)
        return kernels.fused_add_rms_norm(x, residual, weight, eps)

    return KernelOps(name="triton", rms_norm=rms_norm, rotary=kernels.rotary_embedding,
                     reshape_and_cache=kernels.reshape_and_cache,
                     silu_and_mul=reference.silu_and_mul_ref, attention=attention,
                     fused_moe=kernels.fused_moe)


def cpu_ops() -> KernelOps:
    """The C++ operators: paged attention reading the cache blocks in place, fused RMSNorm
    (+ residual), rotary, SiLU-and-mul and the cache write; MoE experts grouped on oneDNN
    with prepacked weights (kernels.moe_cpu)."""

    def attention(query, key_cache, value_cache, inputs: AttentionInputs, scale,
                  window: int | None = None, softcap: float | None = None, sinks=None):
        return cpu_attention.paged_attention_cpu(query, key_cache, value_cache,
                                                 inputs.block_tables, inputs.seq_lens,
                                                 inputs.query_start_loc, scale,
                                                 window=window, softcap=softcap, sinks=sinks)

    return KernelOps(name="cpu", rms_norm=cpu_fused.rms_norm_cpu, rotary=cpu_fused.rotary_cpu,
                     reshape_and_cache=cpu_fused.reshape_and_cache_cpu,
                     silu_and_mul=cpu_fused.silu_and_mul_cpu, attention=attention,
                     fused_moe=CpuFusedMoe())


def select_ops(backend: str, device: torch.device) -> KernelOps:
    """The kernels for `backend` on `device`; logs which attention path runs and why."""
    if backend == "auto" and device.type == "cuda":
        backend = "triton"
    elif backend == "auto":
        status = cpu_attention.load()
        if status.ok:
            log.info("attention: C++ CPU operator (%s)", status.detail)
            return cpu_ops()
        log.warning("attention: torch reference (gather + SDPA, a slower path), "
                    "because the C++ CPU operator is unavailable: %s", status.detail)
        return TORCH_OPS
    if backend == "torch":
        log.info("attention: torch reference (attention_backend='torch')")
        return TORCH_OPS
    if backend == "cpu":
        if device.type != "cpu":
            raise ValueError(f"attention_backend='cpu' needs the CPU device, not {device}")
        status = cpu_attention.load()
        if not status.ok:
            raise ValueError(f"attention_backend='cpu': the C++ CPU operator is unavailable: "
                             f"{status.detail}")
        log.info("attention: C++ CPU operator (%s)", status.detail)
        return cpu_ops()
    if device.type != "cuda" and not _triton_interpreter_on():
        raise ValueError("attention_backend='triton' needs a CUDA device (or TRITON_INTERPRET=1 "
                         "for testing on CPU); use 'torch', 'cpu' or 'auto' here")
    log.info("attention: Triton kernels")
    return triton_ops()


def _triton_interpreter_on() -> bool:
    import os

    return os.environ.get("TRITON_INTERPRET") == "1"
