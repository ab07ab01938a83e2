"""paged_attention: causal attention of new tokens over their paged context, in one launch.

Meaning: `reference.paged_attention_ref`. Decodes (one new token) and prompt chunks (many new
tokens, with or without earlier context) of different sequences share one launch.

Work split. A program owns one *query block* of one sequence and one KV head:
  - a query block is BLOCK_Q consecutive new tokens of one sequence times the GROUP query
    heads that share the KV head (GQA/MQA), flattened into BLOCK_M = BLOCK_Q * GROUP_PAD
    rows, so each K/V tile is read once for all the heads that use it;
  - it walks the sequence's block table TILE_N context positions at a time (a tile may span
    several cache blocks, or part of one), loading whole [TILE_N, D] K and V tiles, and keeps
    an online softmax in float32 (flash attention);
  - query blocks are numbered without a host-side table: sequence i owns the ids starting
    at query_start_loc[i] // BLOCK_Q + i, so the grid needs only T // BLOCK_Q + S ids and
    a program finds its sequence by binary search; ids past a sequence's last block exit.

Split-K (flash-decoding). When the grid would not fill the GPU (small batch, long context),
the context of every query block is cut into NUM_SPLITS ranges of whole tiles handled by
separate programs. Each writes its unnormalized partial output with its running max and sum
to a float32 scratch buffer, and a second kernel merges the splits of each (token, head).

Sliding window (window W > 0): a query at position p sees keys p - W < j <= p. A query block
walks only the tiles from its first token's window start on, and splits share only those, so
blocks wholly before the window are never read (the scheduler may have freed them); in the
first tile, positions before the window are masked out of the loads, not just the scores.
Soft-capping (SOFTCAP): scores = c * tanh(scores / c) before the softmax (Gemma 2).
Sinks (SINKS, gpt-oss): one learned logit per query head in every row's denominator, with no
value: the online softmax of the first split starts from it (max = sink, sum = 1), so the
merge of splits counts it once.
"""

from __future__ import annotations

import dataclasses
import functools
import math

import torch
import triton
import triton.language as tl

from folio.kernels._checks import (FLOAT_DTYPES, INDEX_DTYPES, KV_QUANTIZED_DTYPES,
                                   check_contiguous, check_inner_contiguous, check_same_device,
                                   check_shape, check_tensor)
from folio.kernels._launch import (check_launch_device, is_interpreted, multiprocessor_count,
                             next_power_of_2, on_device)
from folio.kernels.kv_quant import row_width
from folio.kernels.reference import check_attention_options
from folio.kernels.triton_dot import dot_f32

_LOG2_E = 1.4426950408889634
_MAX_HEAD_DIM = 256
_MAX_SPLITS = 64
_MAX_SCRATCH_BYTES = 32 << 20


@dataclasses.dataclass(frozen=True)
class AttentionConfig:
    """Launch parameters of `paged_attention`; a field left None is chosen by heuristic.

    block_m: rows per program (query tokens x query heads of one KV head), power of 2, >= 16.
    tile_size: context positions per K/V tile, power of 2, >= 16.
    num_splits: programs that share one query block's context (1 = no split-K).
    """

    block_m: int | None = None
    tile_size: int | None = None
    num_splits: int | None = None
    num_warps: int | None = None
    num_stages: int | None = None


@triton.jit
def _find_sequence(query_start_loc_ptr, q_block, num_seqs, BLOCK_Q: tl.constexpr):
    """Largest i in [0, num_seqs) whose first query-block id start[i] // BLOCK_Q + i <= q_block."""
    lo = q_block * 0
    hi = lo + num_seqs - 1
    while lo < hi:
        mid = (lo + hi + 1) // 2
        first = tl.load(query_start_loc_ptr + mid) // BLOCK_Q + mid
        take = first <= q_block
        lo = tl.where(take, mid, lo)
        hi = tl.where(take, hi, mid - 1)
    return lo


@triton.jit
def _paged_attention_kernel(
    out_ptr, query_ptr, key_cache_ptr, value_cache_ptr, key_scale_ptr, value_scale_ptr,
    block_tables_ptr, seq_lens_ptr, query_start_loc_ptr,
    part_acc_ptr, part_max_ptr, part_sum_ptr, sinks_ptr,
    scale_log2, softcap_log2, window, num_seqs, num_heads, num_splits,
    stride_q_token, stride_q_head, stride_o_token, stride_o_head,
    stride_k_block, stride_k_slot, stride_k_head,
    stride_v_block, stride_v_slot, stride_v_head,
    stride_table,
    GROUP: tl.constexpr, GROUP_PAD: tl.constexpr,
    BLOCK_Q: tl.constexpr, BLOCK_M: tl.constexpr,
    HEAD_DIM: tl.constexpr, HEAD_DIM_PAD: tl.constexpr,
    TILE_N: tl.constexpr, BLOCK_SIZE: tl.constexpr,
    SPLIT: tl.constexpr, DOT_PRECISION: tl.constexpr, DOT_UPCAST: tl.constexpr,
    WINDOWED: tl.constexpr, SOFTCAP: tl.constexpr, KV_INT8: tl.constexpr,
    SINKS: tl.constexpr,
):
    q_block = tl.program_id(0)
    kv_head = tl.program_id(1)
    split = tl.program_id(2)

    seq = _find_sequence(query_start_loc_ptr, q_block, num_seqs, BLOCK_Q)
    q_start = tl.load(query_start_loc_ptr + seq)
    q_end = tl.load(query_start_loc_ptr + seq + 1)
    first_token = q_start + (q_block - (q_start // BLOCK_Q + seq)) * BLOCK_Q
    if first_token >= q_end:
        return
    seq_len = tl.load(seq_lens_ptr + seq)
    context_len = seq_len - (q_end - q_start)        # positions before the new tokens

    # Rows: BLOCK_Q tokens x GROUP_PAD heads; row r is token r // GROUP_PAD, head r % GROUP_PAD.
    rows = tl.arange(0, BLOCK_M)
    row_token = first_token + rows // GROUP_PAD
    row_head = kv_head * GROUP + rows % GROUP_PAD
    row_valid = (row_token < q_end) & (rows % GROUP_PAD < GROUP)
    row_position = context_len + (row_token - q_start)  # causal limit: keys <= this position

    dims = tl.arange(0, HEAD_DIM_PAD)
    dim_valid = dims < HEAD_DIM
    q_offsets = (row_token.to(tl.int64) * stride_q_token + row_head * stride_q_head)[:, None]
    query = tl.load(query_ptr + q_offsets + dims[None, :],
                    mask=row_valid[:, None] & dim_valid[None, :], other=0.0)

    # Keys this query block needs: [first_key, position of its last token].
    last_token = tl.minimum(first_token + BLOCK_Q, q_end) - 1
    kv_len = context_len + (last_token - q_start) + 1
    first_key = kv_len * 0
    if WINDOWED:
        first_key = tl.maximum(context_len + (first_token - q_start) + 1 - window, 0)
    first_tile = first_key // TILE_N
    num_tiles = tl.cdiv(kv_len, TILE_N) - first_tile
    tiles_per_split = tl.cdiv(num_tiles, num_splits)
    tile_begin = first_tile + split * tiles_per_split
    tile_end = tl.minimum(tile_begin + tiles_per_split, first_tile + num_tiles)

    row_max = tl.full([BLOCK_M], float("-inf"), tl.float32)
    row_sum = tl.zeros([BLOCK_M], tl.float32)
    if SINKS:   # scores here are in log2 units: the sink's logit too
        sink = tl.load(sinks_ptr + row_head, mask=row_valid, other=0.0).to(tl.float32)
        sink = sink * 1.4426950408889634
        first = row_valid & (split == 0)
        row_max = tl.where(first, sink, row_max)
        row_sum = tl.where(first, 1.0, row_sum)
    acc = tl.zeros([BLOCK_M, HEAD_DIM_PAD], tl.float32)
    table = block_tables_ptr + seq.to(tl.int64) * stride_table
    for tile in range(tile_begin, tile_end):
        positions = tile * TILE_N + tl.arange(0, TILE_N)
        position_valid = (positions < kv_len) & (positions >= first_key)
        blocks = tl.load(table + positions // BLOCK_SIZE, mask=position_valid, other=0)
        blocks = blocks.to(tl.int64)
        slots = positions % BLOCK_SIZE
        k_offsets = blocks * stride_k_block + slots * stride_k_slot + kv_head * stride_k_head
        v_offsets = blocks * stride_v_block + slots * stride_v_slot + kv_head * stride_v_head

        key_t = tl.load(key_cache_ptr + k_offsets[None, :] + dims[:, None],
                        mask=position_valid[None, :] & dim_valid[:, None], other=0.0)
        # Quantized caches are read in place: an int8 row's float16 scale sits after its
        # HEAD_DIM values (scale pointers are the caches viewed as float16, so the scale's
        # index is the row's byte offset / 2); float8 rows are plain casts.
        if KV_INT8:
            k_scale = tl.load(key_scale_ptr + (k_offsets + HEAD_DIM) // 2, mask=position_valid,
                              other=0.0).to(tl.float32)
            key_t = (key_t.to(tl.float32) * k_scale[None, :]).to(query.dtype)
        else:
            key_t = key_t.to(query.dtype)
        scores = dot_f32(query, key_t, DOT_PRECISION, DOT_UPCAST) * scale_log2
        if SOFTCAP:
            # c*log2(e) * tanh(s / (c*log2(e))) is the cap of s = scores / log2(e), times
            # log2(e); tanh(x) = 1 - 2 / (exp(2x) + 1) saturates cleanly at +-1.
            capped = 1.0 - 2.0 / (tl.math.exp(2.0 * scores / softcap_log2) + 1.0)
            scores = softcap_log2 * capped
        allowed = position_valid[None, :] & (positions[None, :] <= row_position[:, None])
        if WINDOWED:
            allowed = allowed & (positions[None, :] > row_position[:, None] - window)
        scores = tl.where(allowed, scores, float("-inf"))

        new_max = tl.maximum(row_max, tl.max(scores, 1))
        safe_max = tl.where(new_max == float("-inf"), 0.0, new_max)   # all masked so far
        alpha = tl.math.exp2(row_max - safe_max)
        probs = tl.math.exp2(scores - safe_max[:, None])
        row_sum = row_sum * alpha + tl.sum(probs, 1)

        value = tl.load(value_cache_ptr + v_offsets[:, None] + dims[None, :],
                        mask=position_valid[:, None] & dim_valid[None, :], other=0.0)
        if KV_INT8:
            v_scale = tl.load(value_scale_ptr + (v_offsets + HEAD_DIM) // 2,
                              mask=position_valid, other=0.0).to(tl.float32)
            value = (value.to(tl.float32) * v_scale[:, None]).to(query.dtype)
        else:
            value = value.to(query.dtype)
        acc = acc * alpha[:, None] + dot_f32(probs.to(value.dtype), value, DOT_PRECISION,
                                          DOT_UPCAST)
        row_max = new_max

    store_mask = row_valid[:, None] & dim_valid[None, :]
    if SPLIT:
        part_row = (row_token.to(tl.int64) * num_heads + row_head) * num_splits + split
        tl.store(part_max_ptr + part_row, row_max, mask=row_valid)
        tl.store(part_sum_ptr + part_row, row_sum, mask=row_valid)
        tl.store(part_acc_ptr + part_row[:, None] * HEAD_DIM + dims[None, :], acc,
                 mask=store_mask)
    else:
        o_offsets = (row_token.to(tl.int64) * stride_o_token + row_head * stride_o_head)[:, None]
        # Padding rows past a window see no key (sum 0); they are not stored.
        result = acc / tl.where(row_sum > 0, row_sum, 1.0)[:, None]
        tl.store(out_ptr + o_offsets + dims[None, :], result.to(out_ptr.dtype.element_ty),
                 mask=store_mask)


@triton.jit
def _merge_splits_kernel(
    out_ptr, part_acc_ptr, part_max_ptr, part_sum_ptr, query_start_loc_ptr,
    num_seqs, num_heads, num_splits, stride_o_token, stride_o_head,
    HEAD_DIM: tl.constexpr, HEAD_DIM_PAD: tl.constexpr, SPLITS_PAD: tl.constexpr,
):
    token = tl.program_id(0)
    head = tl.program_id(1)
    outside = (token < tl.load(query_start_loc_ptr)) | (
        token >= tl.load(query_start_loc_ptr + num_seqs))
    if outside:                               # token of no sequence: leave `out` untouched
        return
    splits = tl.arange(0, SPLITS_PAD)
    split_valid = splits < num_splits
    dims = tl.arange(0, HEAD_DIM_PAD)
    dim_valid = dims < HEAD_DIM
    part_row = (token.to(tl.int64) * num_heads + head) * num_splits + splits

    part_max = tl.load(part_max_ptr + part_row, mask=split_valid, other=float("-inf"))
    part_sum = tl.load(part_sum_ptr + part_row, mask=split_valid, other=0.0)
    weight = tl.math.exp2(part_max - tl.max(part_max, 0))   # empty split: exp2(-inf) = 0
    weight = tl.where(split_valid, weight, 0.0)
    part_acc = tl.load(part_acc_ptr + part_row[:, None] * HEAD_DIM + dims[None, :],
                       mask=split_valid[:, None] & dim_valid[None, :], other=0.0)
    result = tl.sum(part_acc * weight[:, None], 0) / tl.sum(part_sum * weight, 0)
    o_offset = token.to(tl.int64) * stride_o_token + head * stride_o_head
    tl.store(out_ptr + o_offset + dims, result.to(out_ptr.dtype.element_ty), mask=dim_valid)


@dataclasses.dataclass(frozen=True)
class _Launch:
    block_m: int
    block_q: int
    tile_size: int
    num_splits: int
    num_warps: int
    num_stages: int


@functools.lru_cache(maxsize=1024)
def _choose_launch(config: AttentionConfig, *, num_tokens: int, num_seqs: int,
                   num_heads: int, num_kv_heads: int, head_dim: int, context_bound: int,
                   device: torch.device) -> _Launch:
    """Fill the unset fields of `config` from the batch shape (no device sync)."""
    group_pad = next_power_of_2(num_heads // num_kv_heads)
    decode_like = num_tokens <= num_seqs        # about one new token per sequence
    block_m = config.block_m or max(16 if decode_like else 64, group_pad)
    if block_m < max(16, group_pad) or block_m & (block_m - 1):
        raise ValueError(f"config.block_m must be a power of 2 >= max(16, query heads per KV "
                         f"head rounded up to a power of 2) = {max(16, group_pad)}, "
                         f"got {block_m}")
    tile_size = config.tile_size or (64 if head_dim <= 128 else 32)
    if tile_size < 16 or tile_size & (tile_size - 1):
        raise ValueError(f"config.tile_size must be a power of 2 >= 16, got {tile_size}")
    block_q = block_m // group_pad
    # Programs with work (the grid's T // BLOCK_Q + S ids include some that exit at once).
    programs = min(num_tokens, num_tokens // block_q + num_seqs) * num_kv_heads

    num_splits = config.num_splits
    if num_splits is None:
        num_splits = 1
        target = 4 * multiprocessor_count(device)
        if programs < target:
            by_occupancy = next_power_of_2(-(-target // programs))
            by_length = max(1, context_bound // (4 * tile_size))
            by_memory = max(1, _MAX_SCRATCH_BYTES // (num_tokens * num_heads * head_dim * 4))
            num_splits = min(by_occupancy, by_length, by_memory, _MAX_SPLITS)
            num_splits = 1 << (num_splits.bit_length() - 1)       # round down to a power of 2
    elif not isinstance(num_splits, int) or not 1 <= num_splits <= _MAX_SPLITS:
        raise ValueError(f"config.num_splits must be an int in [1, {_MAX_SPLITS}], "
                         f"got {num_splits!r}")
    num_warps = config.num_warps or (8 if block_m * head_dim >= 128 * 128 else 4)
    num_stages = config.num_stages or (3 if decode_like else 2)
    return _Launch(block_m, block_q, tile_size, num_splits, num_warps, num_stages)


def paged_attention(query: torch.Tensor, key_cache: torch.Tensor, value_cache: torch.Tensor,
                    block_tables: torch.Tensor, seq_lens: torch.Tensor,
                    query_start_loc: torch.Tensor, scale: float,
                    out: torch.Tensor | None = None, *, max_seq_len: int | None = None,
                    config: AttentionConfig | None = None, window: int | None = None,
                    softcap: float | None = None,
                    sinks: torch.Tensor | None = None) -> torch.Tensor:
    """Causal attention of each sequence's new tokens over its whole paged context.

    query [T, H, D]; key_cache/value_cache [N, B, Hkv, D] with H % Hkv == 0, in query's dtype
    or stored quantized (kernels/kv_quant.py: float8 [N, B, Hkv, D], or int8 [N, B, Hkv, D + 2]
    rows of D values and a float16 scale, D even), read in place; block_tables [S, M] int32; seq_lens [S] (context including the new tokens);
    query_start_loc [S + 1], cumulative, query_start_loc[S] <= T. The new tokens of sequence i
    are query[query_start_loc[i]:query_start_loc[i + 1]], the last positions of its context.
    Returns `out` ([T, H, D], query's dtype); rows of no sequence are left untouched.

    max_seq_len: optional bound on seq_lens, only to size split-K (default: M * B).
    window W: a query at position p sees keys p - W < j <= p; blocks wholly before that are
    not read. softcap c: scores = c * tanh(scores / c) before the softmax. sinks [H]: one more
    logit per query head in each row's softmax denominator (gpt-oss).
    Block ids, seq_lens and query_start_loc values are not checked (that needs a device sync).
    """
    check_tensor("query", query, ndim=3, dtypes=FLOAT_DTYPES)
    check_tensor("key_cache", key_cache, ndim=4, dtypes=FLOAT_DTYPES + KV_QUANTIZED_DTYPES)
    check_tensor("value_cache", value_cache, ndim=4, dtypes=FLOAT_DTYPES + KV_QUANTIZED_DTYPES)
    check_tensor("block_tables", block_tables, ndim=2, dtypes=INDEX_DTYPES)
    check_tensor("seq_lens", seq_lens, ndim=1, dtypes=INDEX_DTYPES)
    check_tensor("query_start_loc", query_start_loc, ndim=1, dtypes=INDEX_DTYPES)
    if isinstance(scale, bool) or not isinstance(scale, (int, float)) or not math.isfinite(scale):
        raise TypeError(f"scale must be a finite float, got {scale!r}")
    num_tokens, num_heads, head_dim = query.shape
    check_attention_options(window, softcap, sinks, num_heads)
    if sinks is not None:
        sinks = sinks.to(device=query.device, dtype=torch.float32).contiguous()
    num_kv_heads, block_size = key_cache.shape[2], key_cache.shape[1]
    num_seqs = seq_lens.shape[0]
    for name, cache in (("key_cache", key_cache), ("value_cache", value_cache)):
        if cache.dtype != query.dtype and cache.dtype not in KV_QUANTIZED_DTYPES:
            raise TypeError(f"{name} dtype {cache.dtype} differs from query dtype {query.dtype}")
    if value_cache.dtype != key_cache.dtype:
        raise TypeError(f"value_cache dtype {value_cache.dtype} differs from key_cache dtype "
                        f"{key_cache.dtype}")
    kv_int8 = key_cache.dtype == torch.int8
    if kv_int8 and head_dim % 2:
        raise ValueError(f"an int8 KV cache needs an even head_dim (its float16 scales are "
                         f"read 2-byte aligned), got {head_dim}")
    check_shape("key_cache", key_cache, (None, None, None, row_width(key_cache.dtype, head_dim)))
    check_shape("value_cache", value_cache, key_cache.shape)
    if num_kv_heads == 0 or num_heads % num_kv_heads:
        raise ValueError(f"query heads ({num_heads}) must be a multiple of key_cache KV heads "
                         f"({num_kv_heads})")
    if not 1 <= head_dim <= _MAX_HEAD_DIM:
        raise ValueError(f"query head_dim must be in [1, {_MAX_HEAD_DIM}], got {head_dim}")
    check_shape("block_tables", block_tables, (num_seqs, None))
    check_shape("query_start_loc", query_start_loc, (num_seqs + 1,))
    if out is None:
        out = torch.empty_like(query)
    else:
        check_tensor("out", out, ndim=3, dtypes=(query.dtype,))
        check_shape("out", out, query.shape)
    check_same_device("query", query, key_cache=key_cache, value_cache=value_cache,
                      block_tables=block_tables, seq_lens=seq_lens,
                      query_start_loc=query_start_loc, out=out)
    for name, tensor in (("query", query), ("key_cache", key_cache),
                         ("value_cache", value_cache), ("block_tables", block_tables),
                         ("out", out)):
        check_inner_contiguous(name, tensor)
    check_contiguous("seq_lens", seq_lens)
    check_contiguous("query_start_loc", query_start_loc)
    if config is None:
        config = AttentionConfig()
    elif not isinstance(config, AttentionConfig):
        raise TypeError(f"config must be an AttentionConfig, got {type(config).__name__}")
    check_launch_device("query", query, _paged_attention_kernel)
    if num_tokens == 0 or num_seqs == 0:
        return out

    context_bound = max_seq_len if max_seq_len is not None else block_tables.shape[1] * block_size
    if window is not None:       # a query block reads about a window of keys, not more
        context_bound = min(context_bound, window + 64)
    launch = _choose_launch(config, num_tokens=num_tokens, num_seqs=num_seqs,
                            num_heads=num_heads, num_kv_heads=num_kv_heads, head_dim=head_dim,
                            context_bound=context_bound, device=query.device)
    group = num_heads // num_kv_heads
    head_dim_pad = max(16, next_power_of_2(head_dim))
    split = launch.num_splits > 1
    if split:
        rows = num_tokens * num_heads * launch.num_splits
        part_acc = torch.empty(rows * head_dim, dtype=torch.float32, device=query.device)
        part_stats = torch.empty(2, rows, dtype=torch.float32, device=query.device)
        part_max, part_sum = part_stats[0], part_stats[1]
    else:
        part_acc = part_max = part_sum = out          # unused by the kernel

    grid = (num_tokens // launch.block_q + num_seqs, num_kv_heads, launch.num_splits)
    with on_device(query):
        # The scale pointers: the caches' bytes as float16 (unused unless int8).
        scales = ((key_cache.view(torch.float16), value_cache.view(torch.float16)) if kv_int8
                  else (key_cache, value_cache))
        _paged_attention_kernel[grid](
            out, query, key_cache, value_cache, *scales, block_tables, seq_lens, query_start_loc,
            part_acc, part_max, part_sum, sinks if sinks is not None else out,
            float(scale) * _LOG2_E, float(softcap or 1.0) * _LOG2_E, int(window or 0),
            num_seqs, num_heads, launch.num_splits,
            query.stride(0), query.stride(1), out.stride(0), out.stride(1),
            key_cache.stride(0), key_cache.stride(1), key_cache.stride(2),
            value_cache.stride(0), value_cache.stride(1), value_cache.stride(2),
            block_tables.stride(0),
            GROUP=group, GROUP_PAD=next_power_of_2(group),
            BLOCK_Q=launch.block_q, BLOCK_M=launch.block_m,
            HEAD_DIM=head_dim, HEAD_DIM_PAD=head_dim_pad,
            TILE_N=launch.tile_size, BLOCK_SIZE=block_size,
            SPLIT=split, DOT_PRECISION="ieee" if query.dtype == torch.float32 else "tf32",
            DOT_UPCAST=query.dtype == torch.bfloat16 and is_interpreted(_paged_attention_kernel),
            WINDOWED=window is not None, SOFTCAP=softcap is not None, KV_INT8=kv_int8,
            SINKS=sinks is not None, num_warps=launch.num_warps, num_stages=launch.num_stages,
        )
        if split:
            _merge_splits_kernel[(num_tokens, num_heads)](
                out, part_acc, part_max, part_sum, query_start_loc,
                num_seqs, num_heads, launch.num_splits, out.stride(0), out.stride(1),
                HEAD_DIM=head_dim, HEAD_DIM_PAD=head_dim_pad,
                SPLITS_PAD=next_power_of_2(launch.num_splits),
                num_warps=4,
            )
    return out
