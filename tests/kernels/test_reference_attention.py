"""The torch reference attention against a naive per-token loop (float64)."""

from __future__ import annotations

import math
import random

import torch

from folio.kernels.reference import paged_attention_ref, reshape_and_cache_ref


def _naive(query, key_cache, value_cache, tables, seq_lens, starts, scale):
    block_size = key_cache.shape[1]
    out = torch.zeros_like(query, dtype=torch.float64)
    groups = query.shape[1] // key_cache.shape[2]
    for s in range(len(seq_lens)):
        length = seq_lens[s]
        for t in range(starts[s], starts[s + 1]):
            position = length - (starts[s + 1] - t)
            for h in range(query.shape[1]):
                keys = torch.stack([key_cache[tables[s][p // block_size], p % block_size,
                                              h // groups] for p in range(position + 1)])
                values = torch.stack([value_cache[tables[s][p // block_size], p % block_size,
                                                  h // groups] for p in range(position + 1)])
                weights = torch.softmax(keys.double() @ query[t, h].double() * scale, dim=0)
                out[t, h] = weights @ values.double()
    return out


def test_mixed_batch_shuffled_blocks_with_garbage():
    rng = random.Random(0)
    torch.manual_seed(0)
    block_size, heads, kv_heads, dim = 4, 4, 2, 8
    seq_lens, q_lens = [7, 1, 13, 5], [1, 1, 6, 5]
    blocks = list(range(32))
    rng.shuffle(blocks)
    # Poison the whole cache: only slots written below may influence the result.
    key_cache = torch.full((32, block_size, kv_heads, dim), float("nan"))
    value_cache = torch.full_like(key_cache, float("nan"))
    tables = []
    for length in seq_lens:
        count = math.ceil(length / block_size)
        tables.append([blocks.pop() for _ in range(count)])
        slots = torch.tensor([tables[-1][p // block_size] * block_size + p % block_size
                              for p in range(length)] + [-1])
        k = torch.randn(length + 1, kv_heads, dim)
        reshape_and_cache_ref(k, torch.randn_like(k), key_cache, value_cache, slots)
    starts = [0]
    for n in q_lens:
        starts.append(starts[-1] + n)
    query = torch.randn(starts[-1], heads, dim)
    width = max(len(t) for t in tables)
    table_tensor = torch.tensor([t + [0] * (width - len(t)) for t in tables], dtype=torch.int32)
    out = paged_attention_ref(query, key_cache, value_cache, table_tensor,
                              torch.tensor(seq_lens), torch.tensor(starts), 0.35)
    expected = _naive(query, key_cache, value_cache, tables, seq_lens, starts, 0.35)
    assert not out.isnan().any()
    torch.testing.assert_close(out.double(), expected, rtol=1e-5, atol=1e-5)
