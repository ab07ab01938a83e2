"""fused_moe: the mixture-of-experts feed-forward as two grouped GEMM launches (vLLM's design).

Meaning: `moe_reference.fused_moe_ref`, rounding included (each expert's gate/up products,
SiLU and product rounded to the input dtype, the down product rounded to it before the float32
routing weight multiplies it, the sum over k in float32, rounded once).

1. Align (torch ops, no device-to-host sync, so it can be captured in a CUDA graph): the T*k
   (token, slot) pairs are sorted by expert and each expert's run is padded to a multiple of
   BLOCK_M with a sentinel pair id (T*k), so every BLOCK_M-row block belongs to one expert.
   `block_expert[b]` names it; blocks past the padded total exit at once.
2. Gate/up kernel: a program computes a [BLOCK_M, BLOCK_N] tile of silu(x W_gate^T) * (x W_up^T)
   (GELU's tanh form instead of silu for activation="gelu_tanh") for its block's pairs, with gate and up in two accumulators over the same x tile (one read
   of x for both), and writes the activation row of each pair to a [T*k, I] buffer.
3. Down kernel: a [BLOCK_M, BLOCK_N] tile of act W_2^T, times each pair's routing weight, into
   a float32 [T*k, H] buffer; the sum over the k slots of each token is one torch reduction.
"""

from __future__ import annotations

import dataclasses

import torch
import triton
import triton.language as tl

from folio.kernels._checks import check_inner_contiguous
from folio.kernels._launch import check_launch_device, is_interpreted, next_power_of_2, on_device, \
    round_to
from folio.kernels.moe_reference import check_activation, check_moe_args
from folio.kernels.triton_dot import dot_f32


@dataclasses.dataclass(frozen=True)
class MoEConfig:
    """Launch parameters of `fused_moe`; a field left None is chosen by heuristic.

    block_m: pairs per program (each expert's run is padded to a multiple), power of 2, >= 16;
    block_n, block_k: output columns and reduction step, powers of 2, >= 16.
    """

    block_m: int | None = None
    block_n: int | None = None
    block_k: int | None = None
    num_warps: int | None = None
    num_stages: int | None = None


@triton.jit
def _gate_up_kernel(
    hidden_ptr, w13_ptr, act_ptr,
    sorted_pairs_ptr, block_expert_ptr, padded_total_ptr,
    num_pairs, top_k, hidden_size, inter,
    stride_h_token, stride_w_expert, stride_w_row, stride_act,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
    PRECISION: tl.constexpr, UPCAST: tl.constexpr, GELU: tl.constexpr,
):
    block = tl.program_id(0)
    if block * BLOCK_M >= tl.load(padded_total_ptr):
        return
    dtype = hidden_ptr.dtype.element_ty
    expert = tl.load(block_expert_ptr + block).to(tl.int64)
    pairs = tl.load(sorted_pairs_ptr + block * BLOCK_M + tl.arange(0, BLOCK_M)).to(tl.int64)
    row_ok = pairs < num_pairs
    tokens = pairs // top_k
    cols = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
    col_ok = cols < inter
    w_base = w13_ptr + expert * stride_w_expert
    gate_acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    up_acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for k0 in range(0, hidden_size, BLOCK_K):
        ks = k0 + tl.arange(0, BLOCK_K)
        k_ok = ks < hidden_size
        x = tl.load(hidden_ptr + tokens[:, None] * stride_h_token + ks[None, :],
                    mask=row_ok[:, None] & k_ok[None, :], other=0.0)
        w_mask = k_ok[:, None] & col_ok[None, :]
        w_gate = tl.load(w_base + cols[None, :].to(tl.int64) * stride_w_row + ks[:, None],
                         mask=w_mask, other=0.0)
        w_up = tl.load(w_base + (cols[None, :] + inter).to(tl.int64) * stride_w_row
                       + ks[:, None], mask=w_mask, other=0.0)
        gate_acc += dot_f32(x, w_gate, PRECISION, UPCAST)
        up_acc += dot_f32(x, w_up, PRECISION, UPCAST)
    gate = round_to(gate_acc, dtype)
    up = round_to(up_acc, dtype)
    if GELU:   # GELU's tanh form; tanh(u) = 1 - 2 / (exp(2u) + 1)
        inner = 0.7978845608028654 * (gate + 0.044715 * gate * gate * gate)
        gated = round_to(0.5 * gate * (2.0 - 2.0 / (tl.exp(2.0 * inner) + 1.0)), dtype)
    else:
        gated = round_to(gate / (1.0 + tl.exp(-gate)), dtype)
    act = round_to(gated * up, dtype)
    tl.store(act_ptr + pairs[:, None] * stride_act + cols[None, :], act.to(dtype),
             mask=row_ok[:, None] & col_ok[None, :])


@triton.jit
def _down_kernel(
    act_ptr, w2_ptr, weights_ptr, out_ptr,
    sorted_pairs_ptr, block_expert_ptr, padded_total_ptr,
    num_pairs, hidden_size, inter,
    stride_act, stride_w_expert, stride_w_row, stride_out,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
    PRECISION: tl.constexpr, UPCAST: tl.constexpr,
):
    block = tl.program_id(0)
    if block * BLOCK_M >= tl.load(padded_total_ptr):
        return
    dtype = act_ptr.dtype.element_ty
    expert = tl.load(block_expert_ptr + block).to(tl.int64)
    pairs = tl.load(sorted_pairs_ptr + block * BLOCK_M + tl.arange(0, BLOCK_M)).to(tl.int64)
    row_ok = pairs < num_pairs
    cols = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
    col_ok = cols < hidden_size
    w_base = w2_ptr + expert * stride_w_expert
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for k0 in range(0, inter, BLOCK_K):
        ks = k0 + tl.arange(0, BLOCK_K)
        k_ok = ks < inter
        a = tl.load(act_ptr + pairs[:, None] * stride_act + ks[None, :],
                    mask=row_ok[:, None] & k_ok[None, :], other=0.0)
        w = tl.load(w_base + cols[None, :].to(tl.int64) * stride_w_row + ks[:, None],
                    mask=k_ok[:, None] & col_ok[None, :], other=0.0)
        acc += dot_f32(a, w, PRECISION, UPCAST)
    weight = tl.load(weights_ptr + pairs, mask=row_ok, other=0.0)
    down = round_to(acc, dtype) * weight[:, None]
    tl.store(out_ptr + pairs[:, None] * stride_out + cols[None, :], down,
             mask=row_ok[:, None] & col_ok[None, :])


def align_block_size(topk_ids: torch.Tensor, num_experts: int, block_m: int
                     ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(sorted_pairs, block_expert, padded_total) for BLOCK_M-row blocks of one expert each.

    sorted_pairs [capacity]: pair ids t*k + j grouped by expert, each group padded to a
    multiple of block_m with the sentinel T*k; block_expert [capacity // block_m]: each block's
    expert; padded_total [1]: the rows in use. The capacity is an upper bound known on the host
    (no sync): sum over experts of ceil(n_e / block_m) <= (T*k + min(E, T*k) * (block_m-1)) / block_m.
    """
    flat = topk_ids.reshape(-1).to(torch.int64)
    num_pairs = flat.numel()
    device = flat.device
    counts = torch.zeros(num_experts, dtype=torch.int64, device=device)
    counts.scatter_add_(0, flat, torch.ones_like(flat))
    padded = (counts + block_m - 1) // block_m * block_m
    ends = torch.cumsum(padded, 0)
    order = torch.argsort(flat, stable=True)
    sorted_experts = flat[order]
    first_of_expert = torch.cumsum(counts, 0) - counts
    rank = torch.arange(num_pairs, device=device) - first_of_expert[sorted_experts]
    dest = (ends - padded)[sorted_experts] + rank
    num_blocks = (num_pairs + min(num_experts, num_pairs) * (block_m - 1)) // block_m
    sorted_pairs = torch.full((num_blocks * block_m,), num_pairs, dtype=torch.int64,
                              device=device)
    sorted_pairs[dest] = order
    block_starts = torch.arange(num_blocks, device=device) * block_m
    block_expert = torch.searchsorted(ends, block_starts, right=True).clamp_(max=num_experts - 1)
    return sorted_pairs, block_expert, ends[-1:]


def default_block_m(pairs_per_expert: float) -> int:
    """Rows per block on a GPU: small for decode (few pairs per expert pad less), else larger."""
    return 16 if pairs_per_expert <= 16 else 32 if pairs_per_expert <= 64 else 64


def _pick(config: MoEConfig, pairs_per_expert: float, n: int, k: int, interpreted: bool
          ) -> tuple[int, int, int, int, int]:
    """(block_m, block_n, block_k, num_warps, num_stages) for an [*, k] x [k, n] GEMM."""
    if interpreted:      # the interpreter pays per element of each tile: the smallest tiles
        block_m, cap_n, cap_k = 16, 32, 32
    else:
        block_m = default_block_m(pairs_per_expert)
        cap_n, cap_k = (64, 64) if block_m < 64 else (128, 64)
    block_m = config.block_m or block_m
    block_n = config.block_n or max(16, min(cap_n, next_power_of_2(n)))
    block_k = config.block_k or max(16, min(cap_k, next_power_of_2(k)))
    for name, value in (("block_m", block_m), ("block_n", block_n), ("block_k", block_k)):
        if value < 16 or value & (value - 1):
            raise ValueError(f"config.{name} must be a power of 2 >= 16, got {value}")
    return block_m, block_n, block_k, config.num_warps or 4, config.num_stages or 3


def fused_moe(hidden: torch.Tensor, w13: torch.Tensor, w2: torch.Tensor,
              topk_weights: torch.Tensor, topk_ids: torch.Tensor, activation: str = "silu",
              *, config: MoEConfig | None = None) -> torch.Tensor:
    """sum_j topk_weights[t, j] * expert_{topk_ids[t, j]}(hidden[t]) for every token t -> [T, H].

    hidden [T, H]; w13 [E, 2I, H] (gate rows then up rows); w2 [E, H, I]; topk_weights [T, k]
    (float; used as float32); topk_ids [T, k] int32/int64 in [0, E) (not checked: device values).
    """
    experts, inter, top_k = check_moe_args(hidden, w13, w2, topk_weights, topk_ids)
    check_activation(activation)
    for name, tensor in (("hidden", hidden), ("w13", w13), ("w2", w2)):
        check_inner_contiguous(name, tensor)
    check_launch_device("hidden", hidden, _gate_up_kernel)
    config = config or MoEConfig()
    tokens, hidden_size = hidden.shape
    if tokens == 0:
        return torch.empty_like(hidden)
    num_pairs = tokens * top_k
    interpreted = is_interpreted(_gate_up_kernel)
    precision = "ieee" if hidden.dtype == torch.float32 else "tf32"
    upcast = interpreted and hidden.dtype == torch.bfloat16
    weights = topk_weights.to(torch.float32).reshape(-1).contiguous()

    block_m, bn1, bk1, warps, stages = _pick(config, num_pairs / experts, inter, hidden_size,
                                             interpreted)
    _, bn2, bk2, _, _ = _pick(config, num_pairs / experts, hidden_size, inter, interpreted)
    sorted_pairs, block_expert, padded_total = align_block_size(topk_ids, experts, block_m)
    num_blocks = block_expert.numel()
    act = torch.empty((num_pairs, inter), dtype=hidden.dtype, device=hidden.device)
    down = torch.empty((num_pairs, hidden_size), dtype=torch.float32, device=hidden.device)
    with on_device(hidden):
        _gate_up_kernel[(num_blocks, triton.cdiv(inter, bn1))](
            hidden, w13, act, sorted_pairs, block_expert, padded_total,
            num_pairs, top_k, hidden_size, inter,
            hidden.stride(0), w13.stride(0), w13.stride(1), act.stride(0),
            BLOCK_M=block_m, BLOCK_N=bn1, BLOCK_K=bk1, PRECISION=precision, UPCAST=upcast,
            GELU=activation == "gelu_tanh", num_warps=warps, num_stages=stages,
        )
        _down_kernel[(num_blocks, triton.cdiv(hidden_size, bn2))](
            act, w2, weights, down, sorted_pairs, block_expert, padded_total,
            num_pairs, hidden_size, inter,
            act.stride(0), w2.stride(0), w2.stride(1), down.stride(0),
            BLOCK_M=block_m, BLOCK_N=bn2, BLOCK_K=bk2, PRECISION=precision, UPCAST=upcast,
            num_warps=warps, num_stages=stages,
        )
    return down.view(tokens, top_k, hidden_size).sum(dim=1).to(hidden.dtype)
