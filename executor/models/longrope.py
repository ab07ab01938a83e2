"""LongRoPE's switch as transformers makes it (Phi-3).

transformers rotates a sequence with the short factors while it is at most
`original_max_position_embeddings` long; the step it first gets longer, Phi-3's generate
drops its cache and recomputes the whole sequence with the long factors. Folio does the
same per sequence: a step whose context passes the original length while its cached part
(computed with the short factors) does not is preceded by a prefill of that cached part
with the long factors, into the same slots; the step then runs as planned.

The recomputed blocks are rewritten in place. Blocks shared with another sequence (a
prefix-cache hit, a fork's prompt) are rewritten for that sequence too. With LoRA each
recomputed sequence runs with its own adapter (`lora`), as its tokens first did.
"""

from __future__ import annotations

import numpy as np
import torch

from folio.executor.input_batch import to_device
from folio.executor.ops import AttentionInputs, KernelOps


def recompute_crossing(model: torch.nn.Module, ops: KernelOps, original: int,
                       requests: list, tokens: np.ndarray, attention: AttentionInputs,
                       kv_caches: list[tuple[torch.Tensor, torch.Tensor]],
                       block_size: int, lora=None) -> int:
    """Recompute, with the long factors, the cached tokens of every sequence of this step
    that crosses `original` now. `requests[i]` is the step's i-th sequence (its `row` in
    `tokens`, its `block_ids`). Returns how many sequences were recomputed."""
    seq_lens = attention.seq_lens.tolist()
    starts = attention.query_start_loc.tolist()
    picked = []
    for i, seq_len in enumerate(seq_lens):
        cached = seq_len - (starts[i + 1] - starts[i])
        if seq_len > original and 0 < cached <= original:
            picked.append((requests[i], cached))
    if not picked:
        return 0
    device = attention.slot_mapping.device
    ids, positions, slots, lens, tables = [], [], [], [], []
    width = max(len(request.block_ids) for request, _ in picked)
    for request, cached in picked:
        pos = np.arange(cached)
        blocks = np.asarray(request.block_ids, dtype=np.int64)
        ids.append(tokens[request.row, :cached])
        positions.append(pos)
        slots.append(blocks[pos // block_size] * block_size + pos % block_size)
        lens.append(cached)
        tables.append(np.pad(blocks, (0, width - len(blocks))))
    starts_out = np.concatenate([[0], np.cumsum(lens)])
    inputs = AttentionInputs(
        slot_mapping=to_device(np.concatenate(slots), device),
        block_tables=to_device(np.stack(tables).astype(np.int32), device),
        seq_lens=to_device(np.asarray(lens, dtype=np.int32), device),
        query_start_loc=to_device(starts_out.astype(np.int32), device))
    if lora is not None:   # executor/lora/registry.py: the rows grouped by adapter
        lora.begin_step(picked)
    try:
        model(to_device(np.concatenate(ids).astype(np.int64), device),
              to_device(np.concatenate(positions), device), kv_caches,
              ops.prepare(inputs, block_size), long_rope=True)
    finally:
        if lora is not None:
            lora.end_step()
    return len(picked)

