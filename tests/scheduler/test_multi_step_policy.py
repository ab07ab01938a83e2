"""The scheduler's half of multi-step decoding (scheduler/multi_step.py), against hand-made
results: caps of K - 1 with their slots, the extra tokens counted computed, the length
limit, no caps in a crowd, speculation taking precedence, and a burst's caps not spending
the step's token budget (they run in passes of their own)."""

from __future__ import annotations

import json

from folio.scheduler.multi_step import MAX_RUNNING
from folio.scheduler.scheduler import Scheduler
from folio.shared.config import SchedulerConfig
from folio.shared.protocol.step import StepResult
from folio.shared.sampling_params import SamplingParams


def _scheduler(**extra) -> Scheduler:
    return Scheduler(SchedulerConfig(num_kv_blocks=256, block_size=4, max_model_len=256,
                                     num_scheduler_steps=4, **extra))


def _params(max_tokens: int = 40) -> SamplingParams:
    return SamplingParams(temperature=0.0, ignore_eos=True, max_tokens=max_tokens)


def _prefill(scheduler: Scheduler, count: int, max_tokens: int = 40) -> None:
    """Run the prompts through (in chunks if the budget says so) to their first token."""
    for i in range(count):
        scheduler.add_request(f"r{i}", [1 + i, 2, 3, 4, 5, 6], _params(max_tokens))
    while any(not r.output_token_ids for r in scheduler.requests.values()):
        plan = scheduler.schedule()
        due = [r.handle for r in scheduler.requests.values() if r.num_pending]
        scheduler.update(plan, StepResult(plan.step_id, handles=due, token_ids=[7] * len(due)))


def test_decode_rows_get_bursts_and_their_tokens_count_computed():
    scheduler = _scheduler()
    _prefill(scheduler, 1)
    request = scheduler.requests["r0"]
    plan = scheduler.schedule()
    assert plan.drafts == {0: 3} and plan.running_num_tokens == [1]
    assert len(scheduler.kv.block_ids(request)) * 4 >= 6 + 1 + 3   # the burst's slots too
    outputs = scheduler.update(plan, StepResult(plan.step_id, handles=[0] * 4,
                                                token_ids=[8, 9, 10, 11], drafts=[(0, 3, 3)]))
    assert [o.new_token_ids for o in outputs] == [[8, 9, 10, 11]]   # one entry
    assert request.num_computed_tokens == 10 and request.num_tokens == 11
    stats = scheduler.stats()
    assert (stats["multi_step_bursts"], stats["multi_step_extra_tokens"]) == (1, 3)
    assert "spec_decode_num_drafts" not in stats


def test_a_burst_never_passes_max_tokens():
    scheduler = _scheduler()
    _prefill(scheduler, 1, max_tokens=3)   # one token out, two to go
    assert scheduler.schedule().drafts == {0: 1}


def test_caps_do_not_spend_the_steps_token_budget():
    scheduler = _scheduler(max_num_batched_tokens=8)
    _prefill(scheduler, 6)   # six prompts of 6 tokens, in chunks of at most 8
    plan = scheduler.schedule()
    assert sorted(plan.running_handles) == list(range(6))   # every row in the same step
    assert all(cap == 3 for cap in plan.drafts.values()) and len(plan.drafts) == 6


def test_no_bursts_in_a_crowd_and_speculation_takes_precedence():
    scheduler = _scheduler()
    _prefill(scheduler, MAX_RUNNING + 1)
    assert scheduler.schedule().drafts == {}
    spec = json.dumps({"method": "ngram", "num_speculative_tokens": 2})
    scheduler = _scheduler(speculative_config=spec)
    _prefill(scheduler, 1)
    assert scheduler.schedule().drafts == {0: 2}
    assert "multi_step_bursts" not in scheduler.stats()
