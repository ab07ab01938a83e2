"""Plain-torch references that define what each kernel means.

They are also the CPU path of the executor, so they are vectorized: no Python loop over
tokens. Decodes (one query per sequence) go through one batched attention call; prompt
chunks go through one call per sequence, since padding them together would waste memory.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

from folio.kernels.kv_quant import as_bytes, dequantize_rows, quantize_rows


def reshape_and_cache_ref(key: torch.Tensor, value: torch.Tensor, key_cache: torch.Tensor,
                          value_cache: torch.Tensor, slot_mapping: torch.Tensor) -> None:
    """Write key/value [T, Hkv, D] into caches [N, B, Hkv, W] at flat slots; skip slots < 0.
    A quantized cache (kernels/kv_quant.py) gets quantized rows (W = D + 2 for int8)."""
    num_kv_heads, width = key_cache.shape[2], key_cache.shape[3]
    slots = slot_mapping.long()
    keep = slots >= 0
    if not bool(keep.all()):
        slots, key, value = slots[keep], key[keep], value[keep]
    for rows, cache in ((key, key_cache), (value, value_cache)):
        as_bytes(cache).view(-1, num_kv_heads, width).index_copy_(
            0, slots, as_bytes(quantize_rows(rows, cache.dtype)))


@dataclass(frozen=True)
class DecodeGroup:
    """Decode rows of similar context length, attended in one batched call."""

    tokens: torch.Tensor      # [G] row of each query in `query`
    slots: torch.Tensor       # [G, L] flat cache slot of every context position
    mask: torch.Tensor        # [G, 1, 1, L] True where a key is visible
    lens: torch.Tensor        # [G] context length of each row
    tables: torch.Tensor      # [G, M] block table of each row (windowed layers re-index)
    block_size: int


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
    tables = block_tables[row_index]
    return DecodeGroup(
        tokens=torch.tensor([starts[i] for i in rows], device=device),
        slots=_context_slots(tables, block_size, visible),
        mask=visible[:, None, None, :],
        lens=row_lens,
        tables=tables,
        block_size=block_size,
    )


def _context_slots(tables: torch.Tensor, block_size: int, visible: torch.Tensor,
                   positions: torch.Tensor | None = None) -> torch.Tensor:
    """[G, M] block tables -> [G, L] flat slots of `positions` ([L] or [G, L], default
    0..L-1). Invisible positions point at each row's first position: those slots may hold
    stale or never-written memory (even NaN bit patterns, which a mask would not stop, or a
    block freed once it left the window); the first position always holds a real key."""
    if positions is None:
        positions = torch.arange(visible.shape[1], device=tables.device)
    positions = positions.expand(visible.shape).clamp(min=0)
    blocks = torch.gather(tables.long(), 1, torch.div(positions, block_size,
                                                      rounding_mode="floor"))
    slots = blocks * block_size + positions % block_size
    return torch.where(visible, slots, slots[:, :1])


def _windowed_group(group: DecodeGroup, window: int) -> DecodeGroup:
    """The same rows reading only their last `window` positions: a query at position p sees
    keys j with p - window < j <= p (transformers' sliding-window mask)."""
    width = min(window, group.slots.shape[1])
    first = (group.lens - window).clamp(min=0)                          # [G]
    positions = first[:, None] + torch.arange(width, device=first.device)[None, :]
    visible = positions < group.lens[:, None]
    return DecodeGroup(group.tokens, _context_slots(group.tables, group.block_size, visible,
                                                    positions),
                       visible[:, None, None, :], group.lens, group.tables, group.block_size)


def paged_attention_ref(query: torch.Tensor, key_cache: torch.Tensor, value_cache: torch.Tensor,
                        block_tables: torch.Tensor, seq_lens: torch.Tensor,
                        query_start_loc: torch.Tensor, scale: float,
                        out: torch.Tensor | None = None, *, window: int | None = None,
                        softcap: float | None = None,
                        sinks: torch.Tensor | None = None) -> torch.Tensor:
    """Causal attention of each sequence's new tokens over its paged context.

    query [T, H, D]; caches [N, B, Hkv, D]; block_tables [S, M]; seq_lens [S] (context
    including the new tokens); query_start_loc [S + 1]. Returns [T, H, D] in query's dtype.
    window W: a query at position p sees only keys j with p - W < j <= p, and cache blocks
    wholly before its window are never read (they may have been freed). softcap c: scores
    become c * tanh(scores / c) before the softmax (Gemma 2). sinks [H] (gpt-oss): one more
    logit per head in each row's softmax denominator, with no value (attends to nothing).
    """
    plan = plan_attention(block_tables, seq_lens, query_start_loc, key_cache.shape[1])
    return paged_attention_planned(query, key_cache, value_cache, plan, scale, out,
                                   window=window, softcap=softcap, sinks=sinks)


def check_attention_options(window: int | None, softcap: float | None,
                            sinks: torch.Tensor | None = None, num_heads: int = 0) -> None:
    """A bad per-layer option is the caller's bug: say which one."""
    if sinks is not None and (sinks.dim() != 1 or sinks.shape[0] != num_heads):
        raise ValueError(f"attention sinks must be [num_heads={num_heads}], got "
                         f"{tuple(sinks.shape)}")
    if window is not None and (isinstance(window, bool) or not isinstance(window, int)
                               or window < 1):
        raise ValueError(f"attention window must be a positive int or None, got {window!r}")
    if softcap is not None and not (isinstance(softcap, (int, float)) and softcap > 0):
        raise ValueError(f"attention softcap must be a positive float or None, got {softcap!r}")


def paged_attention_planned(query: torch.Tensor, key_cache: torch.Tensor,
                            value_cache: torch.Tensor, plan: AttentionPlan, scale: float,
                            out: torch.Tensor | None = None, *, window: int | None = None,
                            softcap: float | None = None,
                            sinks: torch.Tensor | None = None) -> torch.Tensor:
    check_attention_options(window, softcap, sinks, query.shape[1])
    if out is None:
        out = torch.empty_like(query)
    for group in plan.decode_groups:
        if window is not None and group.slots.shape[1] > window:
            group = _windowed_group(group, window)
        _decode_attention(query, key_cache, value_cache, group, scale, softcap, out, sinks)
    for (seq, start, q_len, seq_len), mask in zip(plan.chunks, plan.chunk_masks):
        first_key = 0
        if window is not None and seq_len - q_len + 1 > window:
            # Keys before the first query's window are never read, not just masked.
            first_key = seq_len - q_len + 1 - window
        if window is not None and window < seq_len:
            mask = _chunk_mask(q_len, seq_len, key_cache.device, window, first_key)
        _chunk_attention(query, key_cache, value_cache, plan.block_tables[seq], start, q_len,
                         seq_len, first_key, mask, scale, softcap, out, sinks)
    return out


def _chunk_mask(q_len: int, seq_len: int, device: torch.device, window: int | None = None,
                first_key: int = 0) -> torch.Tensor | None:
    if q_len == seq_len and window is None:
        return None
    # New tokens sit at the end of the context: token j sees positions <= offset + j
    # (and, windowed, > offset + j - window).
    key_pos = torch.arange(first_key, seq_len, device=device)
    query_pos = torch.arange(seq_len - q_len, seq_len, device=device)
    visible = key_pos[None, :] <= query_pos[:, None]
    if window is not None:
        visible &= key_pos[None, :] > query_pos[:, None] - window
    return visible


def _gather_context(cache: torch.Tensor, block_table: torch.Tensor, length: int,
                    first: int = 0) -> torch.Tensor:
    """[..., M] block ids -> [..., length - first, Hkv, D]: positions first..length-1."""
    block_size = cache.shape[1]
    first_block = first // block_size
    num_blocks = -(-length // block_size) - first_block
    blocks = cache[block_table[..., first_block:first_block + num_blocks].long()]
    shape = (*blocks.shape[:-4], num_blocks * block_size, *blocks.shape[-2:])
    skip = first - first_block * block_size
    return blocks.reshape(shape)[..., skip:length - first_block * block_size, :, :]


def _attend(q, k, v, mask, scale, softcap, is_causal=False, sinks=None) -> torch.Tensor:
    """softmax(q k^T * scale [soft-capped], masked) v in float32; SDPA when not capped.
    sinks: broadcastable to the scores without their key axis: one more logit per row."""
    q, k, v = q.float(), k.float(), v.float()
    if softcap is None and sinks is None:
        return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, is_causal=is_causal,
                                              scale=scale)
    scores = torch.matmul(q, k.transpose(-1, -2)) * scale
    if softcap is not None:
        scores = torch.tanh(scores / softcap) * softcap
    if is_causal:
        q_len, k_len = scores.shape[-2], scores.shape[-1]
        mask = torch.ones(q_len, k_len, dtype=torch.bool, device=q.device).tril(k_len - q_len)
    if mask is not None:
        scores = scores.masked_fill(~mask, float("-inf"))
    if sinks is None:
        return torch.matmul(scores.softmax(-1), v)
    sink = sinks.float().expand(*scores.shape[:-1], 1)
    probs = torch.cat((scores, sink), dim=-1).softmax(-1)[..., :-1]
    return torch.matmul(probs, v)


def _decode_attention(query, key_cache, value_cache, group: DecodeGroup, scale, softcap,
                      out, sinks=None) -> None:
    _, _, num_kv_heads, width = key_cache.shape
    head_dim = query.shape[-1]
    shape = (*group.slots.shape, num_kv_heads, head_dim)
    flat_slots = group.slots.reshape(-1)
    # index_select copies whole rows and is several times faster than advanced indexing.
    k = dequantize_rows(key_cache.view(-1, num_kv_heads, width).index_select(0, flat_slots),
                        head_dim)
    v = dequantize_rows(value_cache.view(-1, num_kv_heads, width).index_select(0, flat_slots),
                        head_dim)
    k = k.view(shape).transpose(1, 2)                                    # [G, Hkv, L, D]
    v = v.view(shape).transpose(1, 2)
    q = query[group.tokens]                                                     # [G, H, D]
    rows, num_heads, _ = q.shape
    # Fold the query heads of one KV head into the "query length" axis: GQA without
    # copying K/V, and every row stays an independent softmax.
    q = q.view(rows, num_kv_heads, num_heads // num_kv_heads, head_dim)
    if sinks is not None:   # [Hkv, heads per KV head, 1]: the folded rows' heads
        sinks = sinks.view(num_kv_heads, num_heads // num_kv_heads, 1)
    result = _attend(q, k, v, group.mask, scale, softcap, sinks=sinks)
    out.index_copy_(0, group.tokens, result.reshape(rows, num_heads, head_dim).to(out.dtype))


def _chunk_attention(query, key_cache, value_cache, block_table, start, q_len, seq_len,
                     first_key, mask, scale, softcap, out, sinks=None) -> None:
    head_dim = query.shape[-1]
    k = dequantize_rows(_gather_context(key_cache, block_table, seq_len, first_key), head_dim)
    v = dequantize_rows(_gather_context(value_cache, block_table, seq_len, first_key), head_dim)
    k, v = k.transpose(0, 1)[None], v.transpose(0, 1)[None]
    q = query[start:start + q_len].transpose(0, 1)[None]                          # [1,H,Q,D]
    groups = q.shape[1] // k.shape[1]
    if groups > 1:
        k = k.repeat_interleave(groups, dim=1)
        v = v.repeat_interleave(groups, dim=1)
    if sinks is not None:
        sinks = sinks.view(1, -1, 1, 1)
    result = _attend(q, k, v, mask, scale, softcap, is_causal=mask is None, sinks=sinks)
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
