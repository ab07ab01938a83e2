"""Random paged-attention batches and a float64 oracle that reads only what it must."""

from __future__ import annotations

import dataclasses

import torch


@dataclasses.dataclass
class PagedBatch:
    query: torch.Tensor            # [T, H, D]
    key_cache: torch.Tensor        # [N, B, Hkv, D], NaN wherever no token was written
    value_cache: torch.Tensor
    block_tables: torch.Tensor     # [S, M], shuffled block ids, spare columns hold other ids
    seq_lens: torch.Tensor         # [S]
    query_start_loc: torch.Tensor  # [S + 1]
    scale: float

    def args(self) -> tuple:
        return (self.query, self.key_cache, self.value_cache, self.block_tables,
                self.seq_lens, self.query_start_loc, self.scale)


def make_batch(seqs: list[tuple[int, int]], *, block_size: int, head_dim: int, num_heads: int,
               num_kv_heads: int, dtype: torch.dtype, device: torch.device, seed: int,
               spare_blocks: int = 3, table_dtype: torch.dtype = torch.int32,
               len_dtype: torch.dtype = torch.int32, window: int | None = None) -> PagedBatch:
    """seqs: (context already cached, new tokens) per sequence; the new tokens' K/V are in
    the cache too (reshape_and_cache runs before attention), at the end of the context.
    window: blocks wholly before every new token's window are "freed" afterwards, their
    table entries pointing at a block of NaN (as the scheduler's null block may hold), so a
    kernel that reads them rather than skipping them fails."""
    gen = torch.Generator().manual_seed(seed)
    seq_lens = [context + new for context, new in seqs]
    blocks_needed = [-(-n // block_size) for n in seq_lens]
    num_blocks = sum(blocks_needed) + spare_blocks
    width = max(blocks_needed) + 1
    ids = torch.randperm(num_blocks, generator=gen)
    tables = torch.randint(0, num_blocks, (len(seqs), width), generator=gen)
    used = 0
    for i, n in enumerate(blocks_needed):
        tables[i, :n] = ids[used:used + n]
        used += n

    shape = (num_blocks, block_size, num_kv_heads, head_dim)
    key_cache = torch.full(shape, float("nan"), dtype=dtype)
    value_cache = torch.full(shape, float("nan"), dtype=dtype)
    for i, n in enumerate(seq_lens):
        positions = torch.arange(n)
        blocks = tables[i, positions // block_size]
        slots = positions % block_size
        key_cache[blocks, slots] = torch.randn(n, num_kv_heads, head_dim, generator=gen).to(dtype)
        value_cache[blocks, slots] = torch.randn(n, num_kv_heads, head_dim,
                                                 generator=gen).to(dtype)
    new_tokens = [new for _, new in seqs]
    starts = [0]
    for n in new_tokens:
        starts.append(starts[-1] + n)
    query = torch.randn(starts[-1], num_heads, head_dim, generator=gen).to(dtype)
    if window is not None:
        null_block = int(ids[used])            # a spare block, never written: all NaN
        for i, (context, _) in enumerate(seqs):
            dead = max(0, context + 1 - window) // block_size
            tables[i, :dead] = null_block
    return PagedBatch(
        query=query.to(device), key_cache=key_cache.to(device),
        value_cache=value_cache.to(device),
        block_tables=tables.to(table_dtype).to(device),
        seq_lens=torch.tensor(seq_lens, dtype=len_dtype, device=device),
        query_start_loc=torch.tensor(starts, dtype=len_dtype, device=device),
        scale=head_dim ** -0.5)


def oracle(batch: PagedBatch, window: int | None = None,
           softcap: float | None = None, sinks: torch.Tensor | None = None) -> torch.Tensor:
    """Float64 attention, one sequence at a time, gathering exactly the context positions
    each query sees (p - window < j <= p); softcap: scores = c * tanh(scores / c); sinks [H]:
    one more logit per head in the softmax, whose probability is dropped (gpt-oss)."""
    query = batch.query.cpu().double()
    key_cache, value_cache = batch.key_cache.cpu().double(), batch.value_cache.cpu().double()
    tables = batch.block_tables.cpu().long()
    block_size = key_cache.shape[1]
    groups = query.shape[1] // key_cache.shape[2]
    out = torch.full_like(query, float("nan"))
    starts = batch.query_start_loc.tolist()
    for i, seq_len in enumerate(batch.seq_lens.tolist()):
        start, end = starts[i], starts[i + 1]
        if end == start:
            continue
        query_positions = torch.arange(seq_len - (end - start), seq_len)
        first = 0 if window is None else max(0, int(query_positions[0]) + 1 - window)
        positions = torch.arange(first, seq_len)
        blocks, slots = tables[i, positions // block_size], positions % block_size
        k = key_cache[blocks, slots].repeat_interleave(groups, dim=1)    # [L, H, D]
        v = value_cache[blocks, slots].repeat_interleave(groups, dim=1)
        q = query[start:end]                                              # [Q, H, D]
        scores = torch.einsum("qhd,khd->hqk", q, k) * batch.scale
        if softcap is not None:
            scores = torch.tanh(scores / softcap) * softcap
        visible = positions[None, :] <= query_positions[:, None]          # [Q, L]
        if window is not None:
            visible &= positions[None, :] > query_positions[:, None] - window
        scores = scores.masked_fill(~visible, float("-inf"))
        if sinks is None:
            probs = scores.softmax(-1)
        else:
            sink = sinks.cpu().double()[:, None, None].expand(-1, len(q), 1)
            probs = torch.cat((scores, sink), dim=-1).softmax(-1)[..., :-1]
        out[start:end] = torch.einsum("hqk,khd->qhd", probs, v)
    return out


def relative_error(actual: torch.Tensor, expected: torch.Tensor) -> float:
    """max |actual - expected| / max |expected|; NaN anywhere in actual gives inf."""
    actual = actual.cpu().double()
    if not bool(torch.isfinite(actual).all()):
        return float("inf")
    return float((actual - expected).abs().max() / expected.abs().max())
