"""The executor's persistent batch builds exactly the inputs a step needs, step after step."""

from __future__ import annotations

import random

import torch

from folio.executor.input_batch import InputBatch
from folio.shared.sampling_params import SamplingParams
from folio.shared.protocol.step import NewRequest, StepPlan

BLOCK = 4


def _expected(batch: InputBatch, scheduled, computed_before):
    """The inputs built the plain way, token by token, from each request's lists."""
    ids, positions, slots, seq_lens, starts, width = [], [], [], [], [0], 0
    for request, count in scheduled:
        width = max(width, len(request.block_ids))
    tables = []
    for (request, count), begin in zip(scheduled, computed_before):
        span = range(begin, begin + count)
        ids += request.token_ids[begin:begin + count]
        positions += span
        slots += [request.block_ids[p // BLOCK] * BLOCK + p % BLOCK for p in span]
        seq_lens.append(begin + count)
        starts.append(starts[-1] + count)
        tables.append(request.block_ids + [0] * (width - len(request.block_ids)))
    return ids, positions, slots, seq_lens, starts, tables


def test_inputs_match_a_plain_rebuild_while_rows_are_reused_and_grown():
    rng = random.Random(7)
    batch = InputBatch(BLOCK, torch.device("cpu"), max_model_len=64, max_num_seqs=2)
    live: dict[int, int] = {}     # handle -> tokens it will have in all
    next_block, handle = 1, 0
    for step in range(40):
        plan = StepPlan(step_id=step)
        for done in [h for h in live if rng.random() < 0.2]:
            plan.dropped_handles.append(done)
            del live[done]
        for _ in range(rng.randint(0, 3)):   # more than max_num_seqs: the rows must grow
            handle += 1
            prompt = [rng.randrange(1, 500) for _ in range(rng.randint(1, 20))]
            cached = rng.randrange(0, len(prompt)) // BLOCK * BLOCK
            blocks = list(range(next_block, next_block + -(-len(prompt) // BLOCK)))
            next_block += len(blocks)
            plan.new_requests.append(NewRequest(handle, prompt, len(prompt), cached,
                                                len(prompt) - cached, blocks,
                                                SamplingParams()))
            live[handle] = len(prompt)
        for h in list(live):
            request = batch.requests.get(h)
            if request is None or len(request.token_ids) >= 60:
                continue
            plan.running_handles.append(h)
            plan.running_num_tokens.append(1)
            if (len(request.token_ids) - 1) % BLOCK == 0:   # its next position needs a block
                plan.new_block_ids[h] = [next_block]
                next_block += 1
        scheduled = batch.apply(plan)
        if not scheduled:
            continue
        before = [r.num_computed for r, _ in scheduled]
        ids, positions, slots, seq_lens, starts, tables = _expected(batch, scheduled, before)
        inputs = batch.prepare(scheduled)
        assert inputs.input_ids.tolist() == ids
        assert inputs.positions.tolist() == positions
        assert inputs.attention.slot_mapping.tolist() == slots
        assert inputs.attention.seq_lens.tolist() == seq_lens
        assert inputs.attention.query_start_loc.tolist() == starts
        assert inputs.attention.block_tables.tolist() == tables
        assert inputs.attention.block_tables.dtype == torch.int32
        assert inputs.logits_indices.tolist() == [s - 1 for s in starts[1:]]
        for request in inputs.sampled:
            batch.append_token(request, rng.randrange(1, 500))
    assert len(batch.rows.tokens) > 2     # grown past max_num_seqs rows
    assert handle > 20


def test_a_reused_row_carries_no_stale_blocks():
    batch = InputBatch(BLOCK, torch.device("cpu"), max_model_len=32, max_num_seqs=1)
    long = NewRequest(1, list(range(1, 17)), 16, 0, 16, [5, 6, 7, 8], SamplingParams())
    batch.apply(StepPlan(step_id=0, new_requests=[long]))
    short = NewRequest(2, [9, 9], 2, 0, 2, [3], SamplingParams())
    scheduled = batch.apply(StepPlan(step_id=1, dropped_handles=[1], new_requests=[short]))
    assert batch.requests[2].row == 0
    assert batch.rows.tables[0].tolist()[:4] == [3, 0, 0, 0]
    assert batch.prepare(scheduled).input_ids.tolist() == [9, 9]
