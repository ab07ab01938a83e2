"""The scheduler's half of speculative decoding (scheduler/spec_decode.py), against
hand-made results: draft caps and their slots, verified-token accounting, the length
limit, the large-batch and low-acceptance policy, and the counters."""

from __future__ import annotations

import json

from folio.scheduler.scheduler import Scheduler
from folio.shared.config import SchedulerConfig
from folio.shared.sampling_params import SamplingParams
from folio.shared.protocol.step import StepResult


def _scheduler(**spec) -> Scheduler:
    settings = {"method": "ngram", "num_speculative_tokens": 4, **spec}
    return Scheduler(SchedulerConfig(num_kv_blocks=64, block_size=4, max_model_len=256,
                                     speculative_config=json.dumps(settings)))


def _params(**extra) -> SamplingParams:
    return SamplingParams(temperature=0.0, ignore_eos=True, **{"max_tokens": 40, **extra})


def _result(plan, tokens: dict[int, list[int]], drafts=()) -> StepResult:
    handles = [h for h, ts in tokens.items() for _ in ts]
    return StepResult(plan.step_id, handles=handles,
                      token_ids=[t for ts in tokens.values() for t in ts], drafts=list(drafts))


def test_a_decode_step_carries_drafts_and_accepted_ones_count_computed():
    scheduler = _scheduler()
    scheduler.add_request("a", [1, 2, 3, 4, 5, 6], _params())
    request = scheduler.requests["a"]
    plan = scheduler.schedule()
    assert plan.drafts == {}   # a prompt step carries none
    scheduler.update(plan, _result(plan, {0: [7]}))
    plan = scheduler.schedule()
    assert plan.drafts == {0: 4} and plan.running_num_tokens == [1]
    # Slots for the verified token (position 6) and four drafts (7..10).
    assert len(scheduler.kv.block_ids(request)) * 4 >= 11
    outputs = scheduler.update(plan, _result(plan, {0: [8, 9, 10]}, [(0, 4, 2)]))
    assert request.num_computed_tokens == 9 and request.num_tokens == 10
    assert [o.new_token_ids for o in outputs] == [[8, 9, 10]]   # one entry, in order
    assert request.num_pending == 0 and request.num_draft_slots == 0
    # Only blocks full of verified, computed tokens are in the prefix cache.
    assert len(scheduler.kv.block_hashes(request)) == 9 // 4
    stats = scheduler.stats()
    assert (stats["spec_decode_num_drafts"], stats["spec_decode_num_draft_tokens"],
            stats["spec_decode_num_accepted_tokens"]) == (1, 4, 2)
    assert stats["spec_decode_num_accepted_tokens_per_pos"] == [1, 1, 0, 0]


def test_one_step_ahead_reserves_for_the_drafts_in_flight():
    scheduler = _scheduler()
    scheduler.add_request("a", [1, 2, 3, 4, 5, 6], _params())
    request = scheduler.requests["a"]
    first = scheduler.schedule()
    scheduler.update(first, _result(first, {0: [7]}))
    step1 = scheduler.schedule()
    step2 = scheduler.schedule()   # planned before step 1's result
    assert step1.drafts == {0: 4} and step2.drafts == {0: 4}
    # Step 2 writes at most up to position 6 + 4 + 1 + 4 = 15: 16 slots.
    assert len(scheduler.kv.block_ids(request)) * 4 >= 16
    scheduler.update(step1, _result(step1, {0: [8, 9, 10, 11, 12]}, [(0, 4, 4)]))
    assert request.num_computed_tokens == 8 + 4 and request.num_draft_slots == 4
    scheduler.update(step2, _result(step2, {0: [13]}, [(0, 3, 0)]))
    assert request.num_computed_tokens == 12 and request.num_tokens == 13
    assert request.num_pending == 0 and request.num_draft_slots == 0


def test_drafts_stop_short_of_the_length_limit():
    scheduler = _scheduler()
    scheduler.add_request("a", [1, 2, 3], _params(max_tokens=4))
    plan = scheduler.schedule()
    scheduler.update(plan, _result(plan, {0: [7]}))
    plan = scheduler.schedule()
    # Tokens after the step: at most 3 + 4 = 7 = computed (4) + drafts + 1 after it.
    assert plan.drafts == {0: 2}
    outputs = scheduler.update(plan, _result(plan, {0: [8, 9, 10]}, [(0, 2, 2)]))
    assert outputs.entries[-1].finish_reason == "length"
    assert scheduler.stats()["kv_blocks_free"] == 64


def test_no_drafts_in_a_large_batch():
    scheduler = _scheduler(max_running=2)
    for name in "abc":
        scheduler.add_request(name, [1, 2, 3, 4, 5], _params())
    plan = scheduler.schedule()
    scheduler.update(plan, _result(plan, {0: [7], 1: [7], 2: [7]}))
    plan = scheduler.schedule()
    assert plan.drafts == {}
    scheduler.abort_request("c")
    scheduler.update(plan, _result(plan, {0: [8], 1: [8], 2: [8]}))
    assert set(scheduler.schedule().drafts) == {0, 1}


def test_a_request_whose_drafts_are_rejected_pauses_then_tries_again():
    scheduler = _scheduler(acceptance_window=8, min_acceptance=0.5, cooldown_steps=3)
    scheduler.add_request("a", [1, 2, 3, 4, 5], _params())
    plan = scheduler.schedule()
    scheduler.update(plan, _result(plan, {0: [7]}))
    carried = []
    for token in range(10, 20):
        plan = scheduler.schedule()
        carried.append(bool(plan.drafts))
        proposed = plan.drafts.get(0, 0)
        scheduler.update(plan, _result(plan, {0: [token]},
                                       [(0, proposed, 0)] if proposed else []))
    # Two steps of 4 rejected drafts judge it; three steps without; then drafts again.
    assert carried[:6] == [True, True, False, False, False, True]


def test_opted_out_and_prompt_logprobs_requests_get_no_drafts():
    scheduler = _scheduler()
    scheduler.add_request("a", [1, 2, 3, 4, 5], _params(speculative=False))
    scheduler.add_request("b", [1, 2, 3, 4, 5], _params(prompt_logprobs=1))
    plan = scheduler.schedule()
    scheduler.update(plan, _result(plan, {0: [7], 1: [7]}))
    assert scheduler.schedule().drafts == {}


def test_counters_reach_prometheus_and_the_log_line():
    from folio.frontend.metrics import Metrics
    from folio.scheduler.spec_decode import SpecLog
    from folio.shared.protocol import messages as m
    from folio.shared.protocol.wire import Body, unpack

    stats = {"spec_decode_num_drafts": 10, "spec_decode_num_draft_tokens": 40,
             "spec_decode_num_accepted_tokens": 25,
             "spec_decode_num_accepted_tokens_per_pos": [9, 8, 5, 3]}
    _, body = unpack(m.encode_stats(stats))   # declared: the counters cross the wire
    assert m.decode_stats(Body("stats", body)) == stats
    text = Metrics("m").render(stats).decode()
    assert "folio:spec_decode_num_accepted_tokens_total 25.0" in text
    assert 'folio:spec_decode_num_accepted_tokens_per_pos_total{position="2"} 5.0' in text
    log = SpecLog(interval_s=10.0)
    assert log.line(20.0, stats) == ("speculative decoding: 10 drafts of 40 tokens, 62.5% "
                                     "accepted, mean accepted length 3.50")
    assert log.line(25.0, stats) is None


def test_a_step_without_drafts_still_covers_the_drafts_in_flight():
    """One step ahead, a step the policy gives no drafts still writes its token after
    whatever the step in flight accepts: its slots reach past those drafts."""
    scheduler = _scheduler()
    scheduler.add_request("a", [1, 2, 3, 4, 5, 6, 7], _params())
    request = scheduler.requests["a"]
    first = scheduler.schedule()
    scheduler.update(first, _result(first, {0: [9]}))
    step1 = scheduler.schedule()
    assert step1.drafts == {0: 4}
    request.spec_paused_until = 1 << 30   # the policy turns drafts off for it
    step2 = scheduler.schedule()
    assert step2.drafts == {} and step2.running_num_tokens == [1]
    # Step 2's token lands at position 7 + (0..4 accepted in step 1) + 1 <= 12.
    assert len(scheduler.kv.block_ids(request)) * 4 >= 13


def test_the_page_map_shows_the_mean_accepted_length():
    from folio.shared.protocol.kv_map import decode_kv_map, encode_kv_map
    from folio.shared.protocol.wire import Body, unpack

    scheduler = _scheduler()
    scheduler.add_request("a", [1, 2, 3, 4, 5, 6], _params())
    plan = scheduler.schedule()
    scheduler.update(plan, _result(plan, {0: [7]}))
    for accepted in (3, 0):   # two steps with 4 drafts: 3 accepted, then none
        plan = scheduler.schedule()
        tokens = list(range(20 + 5 * accepted, 21 + 6 * accepted))
        scheduler.update(plan, _result(plan, {0: tokens}, [(0, 4, accepted)]))
    _, body = unpack(encode_kv_map(scheduler.kv_map()))
    snapshot = decode_kv_map(Body("kv_map", body))   # declared: it crosses the wire
    assert snapshot["speculative"] == {"drafts": 2, "draft_tokens": 8, "accepted_tokens": 3,
                                       "mean_accepted_length": 2.5}
    request = snapshot["requests"][0]
    assert (request["spec_steps"], request["spec_accepted"]) == (2, 3)
    off = Scheduler(SchedulerConfig(num_kv_blocks=64, block_size=4, max_model_len=256))
    assert "speculative" not in off.kv_map()
