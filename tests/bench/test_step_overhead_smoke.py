"""bench/step_overhead.py end to end for a few requests: a behaviour check, not a timing one.

A real scheduler process, the bench's null executor and its driver, on ipc:// sockets in a
private temporary directory; the bench stops both processes whatever happens.
"""

from __future__ import annotations

import pytest

from bench.step_overhead import NullBatch, measure
from folio.shared.protocol import messages as m
from folio.shared.sampling_params import SamplingParams
from folio.shared.protocol.step import NewRequest, StepPlan

pytestmark = pytest.mark.slow


def test_four_requests_decode_through_a_real_scheduler():
    result = measure(4, seconds=1.0, warmup=0.2, startup_timeout=60.0)
    assert result["steps"] > 10
    assert result["scheduler_steps"] > 10
    assert result["decode_steps"] > 10
    assert result["requests_with_tokens"] == 4
    assert result["min_tokens_per_request"] >= result["decode_steps"]
    assert result["num_running_stat"] == 4
    assert result["executor_errors"] == 0
    assert result["plan_bytes_per_request"] < 64
    assert result["result_bytes_per_request"] < 64


def test_null_batch_keeps_the_persistent_batch():
    batch = NullBatch(block_size=4)
    params = SamplingParams(max_tokens=100, ignore_eos=True)
    first = StepPlan(0, new_requests=[NewRequest(7, [1, 2, 3], 3, 0, 3, [0], params)])
    result = batch.execute(m.decode_plan(_round_trip(first)))
    assert result.handles == [7] and len(result.token_ids) == 1
    second = StepPlan(1, running_handles=[7], running_num_tokens=[1], new_block_ids={7: [5]})
    result = batch.execute(m.decode_plan(_round_trip(second)))
    assert result.handles == [7]
    assert batch.held[7].blocks == [0, 5]
    assert batch.tokens_per_handle() == {7: 2}
    third = StepPlan(2, dropped_handles=[7])
    assert batch.execute(m.decode_plan(_round_trip(third))).handles == []
    assert batch.held == {}
    with pytest.raises(ValueError):
        batch.execute(StepPlan(3, running_handles=[7], running_num_tokens=[1]))


def _round_trip(plan: StepPlan):
    msg_type, body = m.decode(m.encode_plan(plan), frozenset({"plan"}))
    return body
