"""The served part of a cost model (folio/planner/served.py): fitted from a measured trickle
of requests one at a time and rounds of requests at once against the in-process prediction,
added to every step and to each request's way to the scheduler, and clamped at zero."""

from __future__ import annotations

import json
from dataclasses import replace

import pytest

from folio.planner.cost import ServedOverhead, load_cost
from folio.planner.replay import Options, predict
from folio.planner.served import (LoneResult, Rounds, RoundResult, fit_overhead,
                                  serve_flags, trickle_arrivals)
from folio.planner.simulator.inputs import TraceRequest
from tests.planner.hand_cost import hand_cost

ROUNDS = Rounds((4, 16), 8, 6, 1, trickle=4, rate=2.0)
# The trickle's arrivals, far enough apart (6 tokens of 10-20 ms steps) that none overlap.
ARRIVALS = [0.0, 0.6, 1.3, 2.1]


def _rounds(cost, step_ms: float, per_row_ms: float, request_ms: float) -> list[RoundResult]:
    """What a server whose steps cost `step_ms + per_row_ms * rows` more than `cost` says,
    and whose requests reach the scheduler `request_ms` late, would measure."""
    served = replace(cost, served=ServedOverhead(step_ms, per_row_ms, request_ms))
    results = []
    for concurrency in ROUNDS.concurrency:
        trace = [TraceRequest(0.0, ROUNDS.prompt, ROUNDS.output)] * concurrency
        bare, real = (predict(trace, c).summary for c in (cost, served))
        results.append(RoundResult(concurrency, real["ttft_p50_ms"], real["tpot_p50_ms"],
                                   bare["ttft_p50_ms"], bare["tpot_p50_ms"]))
    return results


def _trickle(cost, step_ms: float, per_row_ms: float, request_ms: float,
             arrivals=ARRIVALS) -> list[LoneResult]:
    """What the same server measures for the trickle's requests, one at a time."""
    served = replace(cost, served=ServedOverhead(step_ms, per_row_ms, request_ms))
    trace = [TraceRequest(at, ROUNDS.prompt, ROUNDS.output) for at in arrivals]
    return [LoneResult(at, r.ttft_ms, r.tpot_ms)
            for at, r in zip(arrivals, predict(trace, served).requests)]


def test_the_fit_recovers_a_known_served_overhead():
    cost = hand_cost(base_ms=10, per_prefill_token=0.1)
    fitted = fit_overhead(_rounds(cost, 3.0, 0.25, 7.0), cost, ROUNDS,
                          _trickle(cost, 3.0, 0.25, 7.0))
    assert fitted.step_ms == pytest.approx(3.0, abs=1e-6)
    assert fitted.per_row_ms == pytest.approx(0.25, abs=1e-6)
    assert fitted.request_ms == pytest.approx(7.0, abs=1e-3)
    assert [r["concurrency"] for r in fitted.rounds] == [4, 16]
    # The trickle's medians, measured and as the fitted model replays them, agree.
    trickle = fitted.trickle
    assert trickle["requests"] == 4 and trickle["rate"] == 2.0
    assert trickle["predicted_tpot_p50_ms"] == pytest.approx(trickle["tpot_p50_ms"], abs=1e-3)
    assert trickle["predicted_ttft_p50_ms"] == pytest.approx(trickle["ttft_p50_ms"], abs=1e-3)


def test_requests_arriving_together_reach_the_scheduler_together():
    """Each request reaches the scheduler request_ms after it arrives; a clump stays a clump
    and shares its first prompt step, as a served clump did (docs/planner.md)."""
    cost = replace(hand_cost(base_ms=10, per_prefill_token=0.1),
                   served=ServedOverhead(0.0, 0.0, 5.0))
    together = predict([TraceRequest(0.0, 8, 4)] * 3, cost, Options(one_ahead=False)).requests
    alone = predict([TraceRequest(0.0, 8, 4)], replace(cost, served=None),
                    Options(one_ahead=False)).requests[0]
    assert [r.ttft_ms for r in together] == [pytest.approx(together[0].ttft_ms)] * 3
    # One step of three prompts, 5 ms late: slower than one prompt alone, in-process.
    assert together[0].ttft_ms > alone.ttft_ms + 5.0


def test_the_trickle_alone_sets_the_fixed_terms():
    """Without rounds the per-row term stays 0 and the fixed ones come from the requests."""
    cost = hand_cost(base_ms=10, per_prefill_token=0.1)
    fitted = fit_overhead([], cost, ROUNDS, _trickle(cost, 2.0, 0.0, 5.0))
    assert (fitted.step_ms, fitted.per_row_ms) == (pytest.approx(2.0, abs=1e-6), 0.0)
    assert fitted.request_ms == pytest.approx(5.0, abs=1e-3)


def test_one_request_held_up_does_not_move_the_fixed_terms():
    """Medians set the fixed terms: a request whose every token came 3x late (a neighbour's
    wake-up held it) moves neither the step's nor the request's overhead."""
    cost = hand_cost(base_ms=10, per_prefill_token=0.1)
    arrivals = ARRIVALS + [2.8]
    lone = _trickle(cost, 2.0, 0.0, 5.0, arrivals)
    lone[2] = replace(lone[2], tpot_ms=lone[2].tpot_ms * 3, ttft_ms=lone[2].ttft_ms * 3)
    fitted = fit_overhead([], cost, replace(ROUNDS, trickle=5), lone)
    assert fitted.step_ms == pytest.approx(2.0, abs=1e-6)
    assert fitted.request_ms == pytest.approx(5.0, abs=1e-3)


def test_the_trickle_arrives_as_a_seeded_poisson_process():
    rounds = Rounds((), 8, 6, 1, trickle=400, rate=4.0)
    times = trickle_arrivals(rounds, seed=3)
    assert times == trickle_arrivals(rounds, seed=3) != trickle_arrivals(rounds, seed=4)
    gaps = [b - a for a, b in zip(times, times[1:])]
    assert times[0] == 0.0 and len(times) == 400 and min(gaps) >= 0
    # Exponential gaps of mean 1/rate: 399 of them land within 15% of 0.25 s on average.
    assert sum(gaps) / len(gaps) == pytest.approx(0.25, rel=0.15)


def test_a_server_faster_than_predicted_adds_nothing():
    cost = hand_cost(base_ms=10, per_prefill_token=0.1)
    faster = [replace(r, tpot_ms=r.predicted_tpot_ms * 0.8, ttft_ms=r.predicted_ttft_ms * 0.5)
              for r in _rounds(cost, 0, 0, 0)]
    slower_never = [replace(r, tpot_ms=r.tpot_ms * 0.8, ttft_ms=r.ttft_ms * 0.5)
                    for r in _trickle(cost, 0, 0, 0)]
    fitted = fit_overhead(faster, cost, ROUNDS, slower_never)
    assert (fitted.step_ms, fitted.per_row_ms, fitted.request_ms) == (0.0, 0.0, 0.0)


def test_the_served_part_lengthens_steps_and_delays_arrivals():
    """One request, 10 ms steps in-process, + 2 ms a step + 1 ms a row served: 13 ms
    steps; it reaches the scheduler 5 ms after it arrives, so TTFT grows by 5 + 3 ms."""
    cost = hand_cost(base_ms=10)
    trace = [TraceRequest(0.0, 8, 4)]
    bare = predict(trace, cost, Options(one_ahead=False)).summary
    served = predict(trace, replace(cost, served=ServedOverhead(2.0, 1.0, 5.0)),
                     Options(one_ahead=False)).summary
    assert bare["tpot_p50_ms"] == pytest.approx(10) and served["tpot_p50_ms"] == pytest.approx(13)
    assert served["ttft_p50_ms"] == pytest.approx(bare["ttft_p50_ms"] + 8)


def test_the_served_part_round_trips_through_the_cost_file(tmp_path):
    cost = replace(hand_cost(), served=ServedOverhead(1.5, 0.1, 4.0, [{"concurrency": 4}],
                                                      {"requests": 24, "rate": 1.5}),
                   vocab_size=99)
    path = tmp_path / "cost.json"
    path.write_text(cost.to_json())
    assert load_cost(path) == cost
    data = json.loads(path.read_text())
    del data["served"], data["vocab_size"]   # a file calibrated in-process only
    path.write_text(json.dumps(data))
    assert load_cost(path).served is None
    # A file from before the frontend spacing was dropped still reads (the key is ignored).
    data["served"] = {"step_ms": 1.0, "per_row_ms": 0.0, "request_ms": 2.0, "frontend_ms": 6.0}
    path.write_text(json.dumps(data))
    assert load_cost(path).served == ServedOverhead(1.0, 0.0, 2.0)


def test_serve_flags_spell_the_calibrated_engine_flags():
    assert serve_flags({"num_kv_blocks": 128, "dtype": "bfloat16", "cpu_threads": None}) == [
        "--num-kv-blocks", "128", "--dtype", "bfloat16"]
