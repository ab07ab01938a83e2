"""The per-step fast paths (issue 13 item 2) change no behaviour.

- The counts cached on each request for the scheduler's decode loops (num_tokens,
  num_slots, register_at, stop_num_tokens) equal what they cache after every step, through
  recompute and swap preemptions, n > 1 forks, prefix hits, sliding windows, a step in
  flight and a failed step; outputs still match runs alone (check_scheduler, Driver).
- The unsigned fast test of shared/wire.py check_ints (decode_result's `h` and `t`) accepts
  and refuses exactly what the general check does.
- bench/step_overhead.py --repeats reports median and minimum per stage, and the
  scheduler's own sum.
"""

from __future__ import annotations

import pytest

from bench.step_overhead import SCHEDULER_STAGES, breakdown_repeated
from scheduler.request import NEVER
from scheduler.scheduler import Scheduler
from shared import messages as m
from shared.config import SchedulerConfig
from shared.sampling_params import SamplingParams
from shared.step import StepResult
from shared.wire import (INT64, MAX_TOKEN_ID, MAX_TOKENS_PER_MESSAGE, Body, ProtocolError,
                         check_ints_general)
from tests.test_scheduler_properties import (EOS, MAX_MODEL_LEN, PREFIXES, VOCAB, Driver,
                                             check_scheduler)


def _config(**changes) -> SchedulerConfig:
    base = dict(num_kv_blocks=12, block_size=4, max_num_seqs=6, max_num_batched_tokens=16,
                max_model_len=MAX_MODEL_LEN, eos_token_ids=(EOS,), vocab_size=VOCAB,
                preemption_mode="recompute", num_swap_blocks=8, bytes_per_block=1,
                swap_bytes_per_s=1.0, prefill_tokens_per_s=1.0)
    base.update(changes)
    return SchedulerConfig(**base)


CASES = {
    "recompute": _config(),
    "swap": _config(preemption_mode="swap"),
    "no-prefix-cache": _config(enable_prefix_caching=False, preemption_mode="auto"),
    "window": _config(sliding_window=6, preemption_mode="auto", num_kv_blocks=10),
    "chunked": _config(enable_chunked_prefill=True, max_num_batched_tokens=5),
}


@pytest.mark.parametrize("ahead", [False, True], ids=["serial", "one-step-ahead"])
@pytest.mark.parametrize("case", list(CASES))
def test_cached_counts_stay_in_sync_every_step(case, ahead):
    config = CASES[case]
    driver = Driver(config, ahead)
    for i in range(14):
        prefix = PREFIXES[i % len(PREFIXES)][:8 + 4 * (i % 4)]
        tail = [(i * 13 + k) % VOCAB for k in range(i % 5)]
        driver.add(f"w{i}", prefix + tail, SamplingParams(n=1 + i % 3, max_tokens=6 + i % 9))
        driver.step()
        check_scheduler(driver)   # checks the cached counts of every live request
    steps = 0
    while driver.scheduler.has_work() or driver.sent:
        assert steps < 2000
        driver.step()
        check_scheduler(driver)
        steps += 1
    driver.assert_idle()
    counters = driver.scheduler.counters
    assert counters["forks"] > 0
    assert counters["preemptions_recompute"] + counters["preemptions_swap"] > 0
    if config.enable_prefix_caching and config.sliding_window is None:
        assert counters["prefix_cache_hits"] > 0


def test_register_at_after_a_failed_step_rewinds_with_num_registered():
    config = _config(num_kv_blocks=32)
    scheduler = Scheduler(config)
    scheduler.add_request("a", PREFIXES[0][:16], SamplingParams(max_tokens=8))
    scheduler.schedule()   # registers the prompt's 4 full blocks, unconfirmed
    (request,) = scheduler.running
    assert request.num_registered == 4 and request.register_at == 5 * config.block_size
    scheduler.discard_unconfirmed()   # that step failed
    assert request.num_registered == 0 and request.register_at == config.block_size


def test_register_at_is_never_with_the_prefix_cache_off():
    driver = Driver(_config(enable_prefix_caching=False))
    driver.add("a", PREFIXES[1][:10], SamplingParams(max_tokens=4))
    driver.step()
    (request,) = driver.scheduler.running
    assert request.register_at == NEVER
    driver.drain()
    driver.assert_idle()


# ---- decode_result's fast list check ----------------------------------------------------

LISTS = [
    [], [0], [1, 2, 3], [MAX_TOKEN_ID], [MAX_TOKEN_ID + 1], [2**32 - 1], [2**32], [2**63 - 1],
    [2**63], [2**64], [-1], [0, -5], [True], [1, False], [1.0], [1, 2.5], [None], ["1"], [[1]],
    [5, 2**31, 7], [3] * 300, list(range(1000)), None, "abc", 7, {"a": 1},
]


def _decode(handles, tokens):
    body = {"s": 1, "ms": 0.0}
    if handles is not None:
        body["h"] = handles
    if tokens is not None:
        body["t"] = tokens
    return m.decode_result(Body("result", body))


def _reference(value, high):
    """What the general check (no unsigned fast test) answers, as body.ints would say it."""
    body = Body("result", {"x": value} if value is not None else {})
    try:
        present = body._get("x", False)
        return check_ints_general(present, 0, high, MAX_TOKENS_PER_MESSAGE,
                                  lambda rule: body.fail("x", rule))
    except ProtocolError as error:
        return error


@pytest.mark.parametrize("value", LISTS, ids=repr)
def test_the_fast_check_accepts_exactly_what_body_ints_accepts(value):
    for field, high in (("h", INT64[1]), ("t", MAX_TOKEN_ID)):
        other = [0] * len(value) if isinstance(value, list) else [0]
        expected = _reference(value, high)
        args = (value, other) if field == "h" else (other, value)
        try:
            got = getattr(_decode(*args), "handles" if field == "h" else "token_ids")
        except ProtocolError as error:
            assert isinstance(expected, ProtocolError), (field, value)
            assert str(error) == str(expected).replace("'x'", repr(field)), (field, value)
            continue
        assert not isinstance(expected, ProtocolError), (field, value)
        assert got == expected and got is value


def test_a_result_round_trips_through_the_fast_check():
    result = StepResult(4, list(range(256)), [(7 * i) % 32000 for i in range(256)])
    _, body = m.decode(m.encode_result(result), frozenset({"result"}))
    decoded = m.decode_result(body)
    assert (decoded.step_id, decoded.handles, decoded.token_ids) == (
        4, result.handles, result.token_ids)


# ---- the bench's repeated breakdown -----------------------------------------------------

def test_breakdown_repeated_reports_median_min_and_scheduler_own():
    rows = breakdown_repeated(4, repeats=3, steps=5)
    assert rows["repeats"] == 3
    for stat in ("median", "min"):
        stages = rows[stat]
        assert set(SCHEDULER_STAGES) <= set(stages)
        assert {"total", "scheduler own"} <= set(stages)
        assert all(value >= 0 for value in stages.values())
    assert all(rows["min"][name] <= rows["median"][name] for name in rows["min"])
