"""lora_segments: many LoRA adapters applied to one mixed batch in two launches (the
segmented, Punica-style form): out[r] += B_s (A_s x[r]) for every row r of the step that
names an adapter, s being the device slot that adapter sits in.

Adapters sit in slot pools (executor/lora/slot_pools.py): A [slots, R, in] and B [slots,
out, R], zero past each adapter's own rank, so every slot multiplies as rank R. The step's
adapter rows are listed grouped by slot (`rows`), and cut into blocks of BLOCK_M rows that
each belong to one slot (`block_start`, `block_end`, `block_slot`; see `segment_blocks`),
so a program multiplies one block by one adapter's weights:

1. Shrink: t[p] = A_s x[rows[p]] for each listed position p, float32 accumulation, rounded
   to the batch's dtype as torch rounds x @ A^T (into a [P, R] buffer).
2. Expand: out[rows[p]] += round(B_s t[p]), read and written in place (each row is listed
   once, so no two programs write one row).

Meaning: `lora_segments_ref` (torch, per slot); tests compare both with float64.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from folio.kernels._checks import check_inner_contiguous
from folio.kernels._launch import check_launch_device, is_interpreted, next_power_of_2, on_device, \
    round_to
from folio.kernels.triton_dot import dot_f32


@triton.jit
def _program_block(rows_ptr, block_start_ptr, block_end_ptr, block_slot_ptr,
                   BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
    """This program's block: its positions, which are real, their rows, its slot, and its
    output columns."""
    block = tl.program_id(0)
    start = tl.load(block_start_ptr + block)
    end = tl.load(block_end_ptr + block)
    slot = tl.load(block_slot_ptr + block).to(tl.int64)
    pos = start + tl.arange(0, BLOCK_M)
    in_block = pos < end
    rows = tl.load(rows_ptr + pos, mask=in_block, other=0).to(tl.int64)
    cols = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
    return pos, in_block, rows, slot, cols


@triton.jit
def _shrink_kernel(x_ptr, a_ptr, t_ptr, rows_ptr, block_start_ptr, block_end_ptr, block_slot_ptr,
                   K, R, stride_x, stride_a0, stride_a1, stride_t,
                   BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
                   DTYPE: tl.constexpr, PRECISION: tl.constexpr, UPCAST: tl.constexpr):
    pos, in_block, rows, slot, cols = _program_block(
        rows_ptr, block_start_ptr, block_end_ptr, block_slot_ptr, BLOCK_M, BLOCK_N)
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for k0 in range(0, K, BLOCK_K):
        ks = k0 + tl.arange(0, BLOCK_K)
        x = tl.load(x_ptr + rows[:, None] * stride_x + ks[None, :],
                    mask=in_block[:, None] & (ks[None, :] < K), other=0.0)
        a = tl.load(a_ptr + slot * stride_a0 + cols[None, :] * stride_a1 + ks[:, None],
                    mask=(cols[None, :] < R) & (ks[:, None] < K), other=0.0)
        acc += dot_f32(x, a, PRECISION, UPCAST)
    tl.store(t_ptr + pos[:, None].to(tl.int64) * stride_t + cols[None, :],
             round_to(acc, DTYPE), mask=in_block[:, None] & (cols[None, :] < R))


@triton.jit
def _expand_kernel(t_ptr, b_ptr, out_ptr, rows_ptr, block_start_ptr, block_end_ptr,
                   block_slot_ptr, N, R, stride_t, stride_b0, stride_b1, stride_out,
                   BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
                   DTYPE: tl.constexpr, PRECISION: tl.constexpr, UPCAST: tl.constexpr):
    pos, in_block, rows, slot, cols = _program_block(
        rows_ptr, block_start_ptr, block_end_ptr, block_slot_ptr, BLOCK_M, BLOCK_N)
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for k0 in range(0, R, BLOCK_K):
        ks = k0 + tl.arange(0, BLOCK_K)
        t = tl.load(t_ptr + pos[:, None].to(tl.int64) * stride_t + ks[None, :],
                    mask=in_block[:, None] & (ks[None, :] < R), other=0.0)
        b = tl.load(b_ptr + slot * stride_b0 + cols[None, :] * stride_b1 + ks[:, None],
                    mask=(cols[None, :] < N) & (ks[:, None] < R), other=0.0)
        acc += dot_f32(t.to(b.dtype), b, PRECISION, UPCAST)
    mask = in_block[:, None] & (cols[None, :] < N)
    where = out_ptr + rows[:, None] * stride_out + cols[None, :]
    old = tl.load(where, mask=mask, other=0.0).to(tl.float32)
    tl.store(where, round_to(old + round_to(acc, DTYPE), DTYPE).to(out_ptr.dtype.element_ty),
             mask=mask)


def segment_blocks(slot_counts: list[tuple[int, int]], block_m: int, device: torch.device
                   ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(block_start, block_end, block_slot) int32 for rows listed as runs of (slot, count),
    in order: each run cut into blocks of at most block_m positions. Built on the host
    from what the step's plan already says (no device values are read)."""
    starts, ends, slots = [], [], []
    at = 0
    for slot, count in slot_counts:
        for first in range(at, at + count, block_m):
            starts.append(first)
            ends.append(min(first + block_m, at + count))
            slots.append(slot)
        at += count
    made = (torch.tensor(v, dtype=torch.int32) for v in (starts, ends, slots))
    return tuple(t.to(device) for t in made)


BLOCK_M = 16   # rows per program: decode steps have few rows per adapter


def lora_segments(x: torch.Tensor, out: torch.Tensor, a_pool: torch.Tensor,
                  b_pool: torch.Tensor, rows: torch.Tensor,
                  blocks: tuple[torch.Tensor, torch.Tensor, torch.Tensor]) -> torch.Tensor:
    """out[rows[p]] += B_s (A_s x[rows[p]]) in place, s the slot of p's block; returns out.

    x [T, in] and out [T, N] of one float dtype; a_pool [S, R, in], b_pool [S, N, R] of the
    same dtype; rows int32 [P] (row indexes of x, each at most once); blocks from
    `segment_blocks` with BLOCK_M (slot ids in [0, S) are not checked: device values)."""
    for name, tensor in (("x", x), ("out", out), ("a_pool", a_pool), ("b_pool", b_pool)):
        check_inner_contiguous(name, tensor)
        if tensor.dtype != x.dtype:
            raise TypeError(f"{name} is {tensor.dtype}, x is {x.dtype}: one dtype for all")
    slots, rank, k = a_pool.shape
    if x.shape[1] != k or b_pool.shape != (slots, out.shape[1], rank) or \
            out.shape[0] != x.shape[0]:
        raise ValueError(f"shapes do not chain: x {tuple(x.shape)}, a_pool "
                         f"{tuple(a_pool.shape)}, b_pool {tuple(b_pool.shape)}, out "
                         f"{tuple(out.shape)}")
    check_launch_device("x", x, _shrink_kernel)
    num_blocks = blocks[0].numel()
    if num_blocks == 0:
        return out
    interpreted = is_interpreted(_shrink_kernel)
    precision = "ieee" if x.dtype == torch.float32 else "tf32"
    upcast = interpreted and x.dtype == torch.bfloat16
    dtype = {torch.float32: tl.float32, torch.float16: tl.float16,
             torch.bfloat16: tl.bfloat16}[x.dtype]
    cap = 32 if interpreted else 64
    bn_shrink = max(16, min(cap, next_power_of_2(rank)))
    bk_shrink = max(16, min(cap, next_power_of_2(k)))
    bn_expand = max(16, min(cap, next_power_of_2(out.shape[1])))
    bk_expand = max(16, min(cap, next_power_of_2(rank)))
    t = torch.empty((rows.numel(), rank), dtype=x.dtype, device=x.device)
    with on_device(x):
        _shrink_kernel[(num_blocks, triton.cdiv(rank, bn_shrink))](
            x, a_pool, t, rows, *blocks, k, rank,
            x.stride(0), a_pool.stride(0), a_pool.stride(1), t.stride(0),
            BLOCK_M=BLOCK_M, BLOCK_N=bn_shrink, BLOCK_K=bk_shrink, DTYPE=dtype,
            PRECISION=precision, UPCAST=upcast)
        _expand_kernel[(num_blocks, triton.cdiv(out.shape[1], bn_expand))](
            t, b_pool, out, rows, *blocks, out.shape[1], rank,
            t.stride(0), b_pool.stride(0), b_pool.stride(1), out.stride(0),
            BLOCK_M=BLOCK_M, BLOCK_N=bn_expand, BLOCK_K=bk_expand, DTYPE=dtype,
            PRECISION=precision, UPCAST=upcast)
    return out


def lora_segments_ref(x: torch.Tensor, out: torch.Tensor, a_pool: torch.Tensor,
                      b_pool: torch.Tensor, rows: torch.Tensor,
                      slot_counts: list[tuple[int, int]]) -> torch.Tensor:
    """What lora_segments computes, in torch, one slot at a time (in place; returns out)."""
    at = 0
    for slot, count in slot_counts:
        index = rows[at:at + count].long()
        out[index] += (x[index] @ a_pool[slot].t()) @ b_pool[slot].t()
        at += count
    return out
