"""Plain-torch references that define what each kernel means.

They are also the CPU path of the executor, so they are vectorized: no Python loop over
tokens. Decodes (one query per sequence) go through one batched attention call; prompt
chunks go through one call per sequence, since padding them together would waste memory.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F


def reshape_and_cache_ref(key: torch.Tensor, value: torch.Tensor, key_cache: torch.Tensor,
                          value_cache: torch.Tensor, slot_mapping: torch.Tensor) -> None:
    """Write key/value [T, Hkv, D] into caches [N, B, Hkv, D] at flat slots; skip slots < 0."""
    num_kv_heads, head_dim = key_cache.shape[2], key_cache.shape[3]
    slots = slot_mapping.long()
    keep = slots >= 0
    if not bool(keep.all()):
        slots, key, value = slots[keep], key[keep], value[keep]
    key_cache.view(-1, num_kv_heads, head_dim).index_copy_(0, slots, key.to(key_cache.dtype))
    value_cache.view(-1, num_kv_heads, head_dim).index_copy_(0, slots, value.to(value_cache.dtype))


@dataclass(frozen=True)
class AttentionPlan:
    """Index tensors for one step's attention, shared by every layer of that step."""

    decode_tokens: torch.Tensor | None      # [Sd] row of each decode query in `query`
    decode_tables: torch.Tensor | None      # [Sd, M]
    decode_mask: torch.Tensor | None        # [Sd, 1, 1, Ld] True where a key is visible
    decode_len: int
    chunks: tuple[tuple[int, int, int, int], ...]   # (seq, query start, query len, seq len)
    chunk_masks: tuple[torch.Tensor | None, ...]    # None: plain causal (no earlier context)
    block_tables: torch.Tensor


def plan_attention(block_tables: torch.Tensor, seq_lens: torch.Tensor,
                   query_start_loc: torch.Tensor) -> AttentionPlan:
    device = block_tables.device
    starts = query_start_loc.tolist()
    lens = seq_lens.tolist()
    q_lens = [b - a for a, b in zip(starts, starts[1:])]
    decode = [i for i, n in enumerate(q_lens) if n == 1]
    decode_tokens = decode_tables = decode_mask = None
    decode_len = 0
    if decode:
        rows = torch.tensor(decode, device=device)
        decode_tokens = torch.tensor([starts[i] for i in decode], device=device)
        decode_lens = torch.tensor([lens[i] for i in decode], device=device)
        decode_len = int(max(lens[i] for i in decode))
        decode_tables = block_tables[rows]
        visible = torch.arange(decode_len, device=device)[None, :] < decode_lens[:, None]
        decode_mask = visible[:, None, None, :]
    chunks, masks = [], []
    for i, n in enumerate(q_lens):
        if n > 1:
            chunks.append((i, starts[i], n, lens[i]))
            masks.append(_chunk_mask(n, lens[i], device))
    return AttentionPlan(decode_tokens, decode_tables, decode_mask, decode_len, tuple(chunks),
                         tuple(masks), block_tables)


def paged_attention_ref(query: torch.Tensor, key_cache: torch.Tensor, value_cache: torch.Tensor,
                        block_tables: torch.Tensor, seq_lens: torch.Tensor,
                        query_start_loc: torch.Tensor, scale: float,
                        out: torch.Tensor | None = None) -> torch.Tensor:
    """Causal attention of each sequence's new tokens over its whole paged context.

    query [T, H, D]; caches [N, B, Hkv, D]; block_tables [S, M]; seq_lens [S] (context
    including the new tokens); query_start_loc [S + 1]. Returns [T, H, D] in query's dtype.
    """
    plan = plan_attention(block_tables, seq_lens, query_start_loc)
    return paged_attention_planned(query, key_cache, value_cache, plan, scale, out)


def paged_attention_planned(query: torch.Tensor, key_cache: torch.Tensor,
                            value_cache: torch.Tensor, plan: AttentionPlan, scale: float,
                            out: torch.Tensor | None = None) -> torch.Tensor:
    if out is None:
        out = torch.empty_like(query)
    if plan.decode_tokens is not None:
        _decode_attention(query, key_cache, value_cache, plan, scale, out)
    for (seq, start, q_len, seq_len), mask in zip(plan.chunks, plan.chunk_masks):
        _chunk_attention(query, key_cache, value_cache, plan.block_tables[seq], start, q_len,
                         seq_len, mask, scale, out)
    return out


def _chunk_mask(q_len: int, seq_len: int, device: torch.device) -> torch.Tensor | None:
    if q_len == seq_len:
        return None
    # New tokens sit at the end of the context: token j sees positions <= offset + j.
    key_pos = torch.arange(seq_len, device=device)
    query_pos = torch.arange(seq_len - q_len, seq_len, device=device)
    return key_pos[None, :] <= query_pos[:, None]


def _gather_context(cache: torch.Tensor, block_table: torch.Tensor, length: int) -> torch.Tensor:
    """[..., M] block ids -> [..., length, Hkv, D] contiguous context."""
    block_size = cache.shape[1]
    num_blocks = -(-length // block_size)
    blocks = cache[block_table[..., :num_blocks].long()]          # [..., nb, B, Hkv, D]
    shape = (*blocks.shape[:-4], num_blocks * block_size, *blocks.shape[-2:])
    return blocks.reshape(shape)[..., :length, :, :]


def _decode_attention(query, key_cache, value_cache, plan: AttentionPlan, scale, out) -> None:
    num_kv_heads = key_cache.shape[2]
    # Slots past a sequence's end hold stale or never-written memory, possibly NaN bit
    # patterns; a mask alone would let NaN through (NaN * 0), so zero them.
    visible = plan.decode_mask[:, 0, 0, :, None, None]
    k = _gather_context(key_cache, plan.decode_tables, plan.decode_len)
    v = _gather_context(value_cache, plan.decode_tables, plan.decode_len)
    k = torch.where(visible, k, 0).transpose(1, 2)                     # [S, Hkv, L, D]
    v = torch.where(visible, v, 0).transpose(1, 2)
    q = query[plan.decode_tokens]                                      # [S, H, D]
    rows, num_heads, head_dim = q.shape
    # Fold the query heads of one KV head into the "query length" axis: GQA without
    # copying K/V, and every row stays an independent softmax.
    q = q.view(rows, num_kv_heads, num_heads // num_kv_heads, head_dim)
    result = F.scaled_dot_product_attention(q.float(), k.float(), v.float(),
                                            attn_mask=plan.decode_mask, scale=scale)
    out[plan.decode_tokens] = result.reshape(rows, num_heads, head_dim).to(out.dtype)


def _chunk_attention(query, key_cache, value_cache, block_table, start, q_len, seq_len, mask,
                     scale, out) -> None:
    k = _gather_context(key_cache, block_table, seq_len).transpose(0, 1)[None]   # [1,Hkv,L,D]
    v = _gather_context(value_cache, block_table, seq_len).transpose(0, 1)[None]
    q = query[start:start + q_len].transpose(0, 1)[None]                          # [1,H,Q,D]
    groups = q.shape[1] // k.shape[1]
    if groups > 1:
        k = k.repeat_interleave(groups, dim=1)
        v = v.repeat_interleave(groups, dim=1)
    result = F.scaled_dot_product_attention(q.float(), k.float(), v.float(), attn_mask=mask,
                                            is_causal=mask is None, scale=scale)
    out[start:start + q_len] = result[0].transpose(0, 1).to(out.dtype)


def rms_norm_ref(x: torch.Tensor, weight: torch.Tensor, eps: float,
                 residual: torch.Tensor | None = None
                 ) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
    """RMSNorm as Llama computes it; with `residual`, first x += residual and return both."""
    if residual is not None:
        x = x + residual
        residual = x
    dtype = x.dtype
    hidden = x.float()
    variance = hidden.pow(2).mean(-1, keepdim=True)
    normed = weight * (hidden * torch.rsqrt(variance + eps)).to(dtype)
    return normed if residual is None else (normed, residual)


def rotary_ref(positions: torch.Tensor, query: torch.Tensor, key: torch.Tensor,
               cos_sin_cache: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Neox-style rotary embedding. query [T, H, D], key [T, Hkv, D];
    cos_sin_cache [max_pos, D] holds cos in the first D/2 columns and sin in the rest."""
    cos, sin = cos_sin_cache[positions].chunk(2, dim=-1)        # [T, D/2] each
    cos = torch.cat((cos, cos), dim=-1)[:, None, :]
    sin = torch.cat((sin, sin), dim=-1)[:, None, :]
    return _rotate(query, cos, sin), _rotate(key, cos, sin)


def _rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    half = x.shape[-1] // 2
    rotated = torch.cat((-x[..., half:], x[..., :half]), dim=-1)
    return x * cos.to(x.dtype) + rotated * sin.to(x.dtype)
