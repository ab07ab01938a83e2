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
class DecodeGroup:
    """Decode rows of similar context length, attended in one batched call."""

    tokens: torch.Tensor      # [G] row of each query in `query`
    slots: torch.Tensor       # [G, L] flat cache slot of every context position
    mask: torch.Tensor        # [G, 1, 1, L] True where a key is visible


@dataclass(frozen=True)
class AttentionPlan:
    """Index tensors for one step's attention, shared by every layer of that step."""

    decode_groups: tuple[DecodeGroup, ...]
    chunks: tuple[tuple[int, int, int, int], ...]   # (seq, query start, query len, seq len)
    chunk_masks: tuple[torch.Tensor | None, ...]    # None: plain causal (no earlier context)
    block_tables: torch.Tensor


# Decode rows are padded to the longest context of their group; a new group starts when
# padding would exceed this fraction, so short contexts don't pay for long ones.
_DECODE_GROUP_MIN_FILL = 0.7


def plan_attention(block_tables: torch.Tensor, seq_lens: torch.Tensor,
                   query_start_loc: torch.Tensor, block_size: int) -> AttentionPlan:
    device = block_tables.device
    starts = query_start_loc.tolist()
    lens = seq_lens.tolist()
    q_lens = [b - a for a, b in zip(starts, starts[1:])]
    decode = sorted((i for i, n in enumerate(q_lens) if n == 1), key=lambda i: -lens[i])
    groups: list[DecodeGroup] = []
    while decode:
        longest = lens[decode[0]]
        size = 1
        while size < len(decode) and lens[decode[size]] >= longest * _DECODE_GROUP_MIN_FILL:
            size += 1
        rows, decode = decode[:size], decode[size:]
        groups.append(_decode_group(block_tables, rows, starts, lens, longest, block_size))
    chunks, masks = [], []
    for i, n in enumerate(q_lens):
        if n > 1:
            chunks.append((i, starts[i], n, lens[i]))
            masks.append(_chunk_mask(n, lens[i], device))
    return AttentionPlan(tuple(groups), tuple(chunks), tuple(masks), block_tables)


def _decode_group(block_tables, rows, starts, lens, longest, block_size) -> DecodeGroup:
    device = block_tables.device
    row_index = torch.tensor(rows, device=device)
    row_lens = torch.tensor([lens[i] for i in rows], device=device)
    visible = torch.arange(longest, device=device)[None, :] < row_lens[:, None]
    return DecodeGroup(
        tokens=torch.tensor([starts[i] for i in rows], device=device),
        slots=_context_slots(block_tables[row_index], block_size, visible),
        mask=visible[:, None, None, :],
    )


def _context_slots(tables: torch.Tensor, block_size: int, visible: torch.Tensor
                   ) -> torch.Tensor:
    """[G, M] block tables -> [G, L] flat slots. Positions past a sequence's end point at
    its position 0: those slots may hold stale or never-written memory (even NaN bit
    patterns, which a mask would not stop); position 0 always holds a real key."""
    positions = torch.arange(visible.shape[1], device=tables.device)
    slots = tables.long()[:, positions // block_size] * block_size + positions % block_size
    return torch.where(visible, slots, slots[:, :1])


def paged_attention_ref(query: torch.Tensor, key_cache: torch.Tensor, value_cache: torch.Tensor,
                        block_tables: torch.Tensor, seq_lens: torch.Tensor,
                        query_start_loc: torch.Tensor, scale: float,
                        out: torch.Tensor | None = None) -> torch.Tensor:
    """Causal attention of each sequence's new tokens over its whole paged context.

    query [T, H, D]; caches [N, B, Hkv, D]; block_tables [S, M]; seq_lens [S] (context
    including the new tokens); query_start_loc [S + 1]. Returns [T, H, D] in query's dtype.
    """
    plan = plan_attention(block_tables, seq_lens, query_start_loc, key_cache.shape[1])
    return paged_attention_planned(query, key_cache, value_cache, plan, scale, out)


def paged_attention_planned(query: torch.Tensor, key_cache: torch.Tensor,
                            value_cache: torch.Tensor, plan: AttentionPlan, scale: float,
                            out: torch.Tensor | None = None) -> torch.Tensor:
    if out is None:
        out = torch.empty_like(query)
    for group in plan.decode_groups:
        _decode_attention(query, key_cache, value_cache, group, scale, out)
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


def _decode_attention(query, key_cache, value_cache, group: DecodeGroup, scale, out) -> None:
    _, _, num_kv_heads, head_dim = key_cache.shape
    shape = (*group.slots.shape, num_kv_heads, head_dim)
    flat_slots = group.slots.view(-1)
    # index_select copies whole rows and is several times faster than advanced indexing.
    k = key_cache.view(-1, num_kv_heads, head_dim).index_select(0, flat_slots)
    v = value_cache.view(-1, num_kv_heads, head_dim).index_select(0, flat_slots)
    k = k.view(shape).transpose(1, 2)                                    # [G, Hkv, L, D]
    v = v.view(shape).transpose(1, 2)
    q = query[group.tokens]                                                     # [G, H, D]
    rows, num_heads, _ = q.shape
    # Fold the query heads of one KV head into the "query length" axis: GQA without
    # copying K/V, and every row stays an independent softmax.
    q = q.view(rows, num_kv_heads, num_heads // num_kv_heads, head_dim)
    result = F.scaled_dot_product_attention(q.float(), k.float(), v.float(),
                                            attn_mask=group.mask, scale=scale)
    out.index_copy_(0, group.tokens, result.reshape(rows, num_heads, head_dim).to(out.dtype))


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


def silu_and_mul_ref(gate_up: torch.Tensor) -> torch.Tensor:
    """The gated MLP's activation: silu(gate) * up for gate_up = [gate | up] on the last dim."""
    gate, up = gate_up.chunk(2, dim=-1)
    return F.silu(gate) * up


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
