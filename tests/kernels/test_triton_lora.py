"""The segmented LoRA kernel (kernels/triton_lora.py) against float64: several adapters in
one batch, runs longer than a block, rows in any order, rows with no adapter untouched;
natively on CUDA, else under triton's interpreter."""

from __future__ import annotations

import pytest
import torch

from folio.kernels.triton_lora import (BLOCK_M, lora_segments, lora_segments_ref,
                                       segment_blocks)

TOLERANCE = {torch.float32: 1e-4, torch.bfloat16: 3e-2}


def _case(device, dtype, slot_counts, tokens=48, k=40, n=72, slots=4, rank=24, seed=0):
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(tokens, k, generator=gen)
    out = torch.randn(tokens, n, generator=gen)
    a_pool = torch.randn(slots, rank, k, generator=gen) / k ** 0.5
    b_pool = torch.randn(slots, n, rank, generator=gen) / rank ** 0.5
    a_pool[1, rank // 2:] = 0   # a lower-rank adapter: zero past its rank, as the pools keep it
    b_pool[1, :, rank // 2:] = 0
    listed = sum(count for _, count in slot_counts)
    rows = torch.randperm(tokens, generator=gen)[:listed].to(torch.int32)
    return [t.to(device=device, dtype=dtype) for t in (x, out, a_pool, b_pool)] + [rows.to(device)]


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("slot_counts", [
    [(2, 1)],                                   # one decode row
    [(0, 3), (1, 2 * BLOCK_M + 5), (3, 1)],     # a run over several blocks
    [(3, 4), (0, 4), (2, 4), (1, 4)],           # slots in any order
])
def test_segments_match_float64(device, dtype, slot_counts):
    x, out, a_pool, b_pool, rows = _case(device, dtype, slot_counts)
    expected = lora_segments_ref(*(t.double() for t in (x, out.clone(), a_pool, b_pool)),
                                 rows, slot_counts)
    before = out.clone()
    got = lora_segments(x, out, a_pool, b_pool, rows, segment_blocks(slot_counts, BLOCK_M,
                                                                     device))
    assert got is out
    listed = torch.zeros(out.shape[0], dtype=torch.bool)
    listed[rows.long().cpu()] = True
    assert torch.equal(out[~listed.to(device)], before[~listed.to(device)])   # untouched
    error = (out.double() - expected).abs().max().item()
    assert error <= TOLERANCE[dtype] * expected.abs().max().item(), error
    assert (out[listed.to(device)] != before[listed.to(device)]).any()


def test_no_blocks_leaves_out_alone(device):
    x, out, a_pool, b_pool, _ = _case(device, torch.float32, [])
    before = out.clone()
    empty = torch.empty(0, dtype=torch.int32, device=device)
    lora_segments(x, out, a_pool, b_pool, empty, segment_blocks([], BLOCK_M, device))
    assert torch.equal(out, before)


def test_mismatched_shapes_and_dtypes_are_named(device):
    x, out, a_pool, b_pool, rows = _case(device, torch.float32, [(0, 2)])
    blocks = segment_blocks([(0, 2)], BLOCK_M, device)
    with pytest.raises(ValueError, match="shapes do not chain"):
        lora_segments(x, out, a_pool, b_pool[:, :-1], rows, blocks)
    with pytest.raises(TypeError, match="b_pool"):
        lora_segments(x, out, a_pool, b_pool.double(), rows, blocks)


def test_blocks_cut_each_run_at_block_m():
    starts, ends, slots = segment_blocks([(5, 3), (2, 2 * BLOCK_M + 1)], BLOCK_M,
                                         torch.device("cpu"))
    assert starts.tolist() == [0, 3, 3 + BLOCK_M, 3 + 2 * BLOCK_M]
    assert ends.tolist() == [3, 3 + BLOCK_M, 3 + 2 * BLOCK_M, 4 + 2 * BLOCK_M]
    assert slots.tolist() == [5, 2, 2, 2]
