"""The C++ segmented LoRA operator (kernels/cpu/lora_segments.cpp) against a float64
reference: rows of several adapters in any order beside rows of the base model (left
untouched), odd shapes, ranks from 1 to a fused module's 3 x 16 with a block-diagonal B,
groups longer than a row block and outputs wider than a column block, empty groups,
float32 and bfloat16; slots filled by executor/lora/cpu_pools.py (only the non-zero blocks
of B read: a slot's stale weights past its spans never leak in); bad tables refused by name."""

from __future__ import annotations

import pytest
import torch

from folio.executor.lora.adapter import LoraWeights
from folio.executor.lora.cpu_pools import LoraCpuPools, nonzero_spans
from folio.kernels.cpu_lora import lora_segments_cpu

pytestmark = pytest.mark.usefixtures("cpu_ops_built")

TOLERANCE = {torch.float32: dict(rtol=1e-5, atol=1e-4),
             torch.bfloat16: dict(rtol=2e-2, atol=3e-2)}
PATH = "layers.0.self_attn.qkv_proj"


def _pair(gen, size_in, slices, ranks):
    """An adapter's fused (A, B): A's ranks stacked, B block-diagonal at the slices' rows
    (a slice of rank 0 is left alone: zero rows)."""
    a = torch.randn(sum(ranks), size_in, generator=gen)
    b = torch.zeros(sum(slices), sum(ranks))
    row = column = 0
    for rank, rows in zip(ranks, slices):
        b[row:row + rows, column:column + rank] = torch.randn(rows, rank, generator=gen)
        row, column = row + rows, column + rank
    return a, b


def _run(dtype, size_in, slices, adapters, assignment, max_rank, slots):
    """`adapters`: name -> rank per slice (0: slice left alone); `assignment`: each row's
    adapter name or None. Returns (got, want) for the rows in order."""
    gen = torch.Generator().manual_seed(size_in + len(assignment))
    size_out = sum(slices)
    pools = LoraCpuPools(slots, max_rank, dtype)
    # Another adapter's weights first in every slot: the real ones must read none of them.
    junk = {PATH: _pair(gen, size_in, slices, [max_rank] * len(slices))}
    pairs = {}
    for slot, (name, ranks) in enumerate(adapters.items()):
        pools.put(slot, LoraWeights("junk", "", max_rank, junk))
        pairs[name] = tuple(t.to(dtype) for t in _pair(gen, size_in, slices, ranks))
        pools.put(slot, LoraWeights(name, "", max(ranks), {PATH: pairs[name]}))
    x = torch.randn(len(assignment), size_in, generator=gen).to(dtype)
    out = torch.randn(len(assignment), size_out, generator=gen).to(dtype)
    want = out.double().clone()
    rows, table = [], []
    names = list(adapters)
    for slot, name in enumerate(names):
        mine = [r for r, n in enumerate(assignment) if n == name]
        table.append((slot, len(rows), len(mine)))
        rows.extend(mine)
        a, b = (t.double() for t in pairs[name])
        for r in mine:
            want[r] += b @ (a @ x[r].double())
    got = lora_segments_cpu(x, out, pools.modules[PATH].a, pools.modules[PATH].bt,
                            pools.modules[PATH].spans, torch.tensor(rows, dtype=torch.int64),
                            torch.tensor(table, dtype=torch.int64).reshape(-1, 3))
    return got, want


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("size_in, slices, adapters, max_rank", [
    # A fused q/k/v-like module: block-diagonal B, one adapter skipping k, rank 1 and 16.
    (37, [40, 12, 12], {"a": [16, 16, 16], "b": [3, 0, 5], "c": [1, 1, 1]}, 16),
    # One plain module wider than a column block, odd ranks.
    (53, [301], {"a": [5], "b": [16], "c": [1], "d": [7]}, 16),
])
def test_matches_float64_with_base_rows_and_any_order(dtype, size_in, slices, adapters,
                                                      max_rank):
    names = list(adapters)
    # Rows interleaved, one adapter with more rows than a row block, base rows between.
    assignment = [None if i % 5 == 4 else names[(i * 7) % len(names)] for i in range(43)]
    assignment += [names[0]] * 11
    got, want = _run(dtype, size_in, slices, adapters, assignment, max_rank, slots=5)
    assert got.dtype == dtype
    torch.testing.assert_close(got.double(), want, **TOLERANCE[dtype])
    base = [r for r, n in enumerate(assignment) if n is None]
    assert base and torch.equal(got[base].double(), want[base])   # untouched, exactly


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_a_large_call_runs_parallel_and_matches(dtype):
    # Over 2^19 rows x R x (in + out): the passes run parallel over row and column blocks
    # (the other tests' calls are under it: inline).
    adapters = {"a": [16, 16, 16], "b": [9, 0, 16], "c": [2, 2, 2]}
    assignment = [["a", "b", "c", None][(i * 3) % 4] for i in range(800)]
    got, want = _run(dtype, 100, [100, 50, 50], adapters, assignment, 16, slots=3)
    assert 600 * 48 * 300 > 1 << 19 > 54 * 48 * (37 + 64)
    torch.testing.assert_close(got.double(), want, **TOLERANCE[dtype])


def test_empty_groups_and_no_rows_change_nothing():
    adapters = {"a": [4], "b": [2]}
    got, want = _run(torch.float32, 19, [23], adapters, [None, "b", None], 4, slots=2)
    torch.testing.assert_close(got.double(), want, **TOLERANCE[torch.float32])   # "a": empty
    got, want = _run(torch.float32, 19, [23], adapters, [None, None], 4, slots=2)
    assert torch.equal(got.double(), want)


def test_spans_are_the_non_zero_blocks_of_a_block_diagonal_b():
    b = torch.zeros(10, 6)
    b[0:4, 0:2] = 1.0
    b[7:10, 2:6] = 2.0          # rows 4-6 (a slice left alone) stay zero
    assert nonzero_spans(b) == [(0, 4, 0, 2), (7, 10, 2, 6)]
    b[8, 2] = 0.0               # a row whose non-zeros span less: a run of its own
    assert nonzero_spans(b) == [(0, 4, 0, 2), (7, 8, 2, 6), (8, 9, 3, 6), (9, 10, 2, 6)]
    assert nonzero_spans(torch.zeros(3, 2)) == []
    scattered = torch.zeros(12, 4)
    scattered[::2, 0] = 1.0
    scattered[1::2, 3] = 1.0    # twelve one-row runs: read as one block over them all
    assert nonzero_spans(scattered) == [(0, 12, 0, 4)]


def _tensors(slots=2, rank=4, size_in=8, size_out=6, tokens=5):
    return (torch.zeros(tokens, size_in), torch.zeros(tokens, size_out),
            torch.zeros(slots, rank, size_in), torch.zeros(slots, rank, size_out),
            torch.zeros(slots, 1, 4, dtype=torch.int64))


@pytest.mark.parametrize("rows, groups, match", [
    ([0, 1], [(2, 0, 2)], "slot 2 is not in"),
    ([0, 0], [(0, 0, 2)], "row 0 is listed twice"),
    ([0, 9], [(0, 0, 2)], r"rows\[1\] = 9 is not a row of x"),
    ([0, 1], [(0, 0, 3)], "are not within rows"),
    ([0, 1], [(0, 0, 2), (1, 1, 1)], "overlaps another group"),
])
def test_bad_tables_are_refused_by_name(rows, groups, match):
    x, out, a, bt, spans = _tensors()
    with pytest.raises(RuntimeError, match=match):
        lora_segments_cpu(x, out, a, bt, spans, torch.tensor(rows, dtype=torch.int64),
                          torch.tensor(groups, dtype=torch.int64))


def test_bad_spans_and_dtypes_are_refused_by_name():
    x, out, a, bt, spans = _tensors()
    rows, groups = torch.tensor([0]), torch.tensor([(0, 0, 1)])
    spans[1, 0] = torch.tensor([0, 7, 0, 1])
    with pytest.raises(RuntimeError, match=r"span 1 \(0, 7, 0, 1\) is outside"):
        lora_segments_cpu(x, out, a, bt, spans, rows, groups)
    with pytest.raises(RuntimeError, match="bt has dtype BFloat16"):
        lora_segments_cpu(x, out, a, bt.bfloat16(), spans.zero_(), rows, groups)
