"""`folio plan`'s replay: the serving Scheduler itself, latencies counted by hand on a
hand-made cost, shared prefixes hit, the SLO search and the compared options."""

from __future__ import annotations

import pytest

import folio.engine
import folio.scheduler.service
from folio.planner.replay import Options, predict
from folio.planner.search import compare_options, meets, parse_slo, search_rate
from folio.planner.workload import parse_workload
from folio.scheduler.scheduler import Scheduler
from folio.planner.simulator.inputs import TraceRequest
from tests.planner.hand_cost import hand_cost


def test_the_plan_runs_the_serving_scheduler(cost):
    result = predict([TraceRequest(0.0, 20, 3)], cost)
    # The very class the in-process engine and the scheduler process serve with.
    assert type(result.scheduler) is Scheduler
    assert folio.engine.Scheduler is Scheduler
    assert folio.scheduler.service.Scheduler is Scheduler
    assert result.scheduler.stats()["num_finished"] == 1


def test_latencies_on_a_hand_made_cost():
    """10 ms a step plus 1 ms a prompt token. r0 (t=0, 30 tokens) is prefilled in step 1
    (0-40 ms), then decodes 1 token a step (10 ms). r1 arrives at 45 ms, during step 2
    (40-50): it joins step 3 (50-80 ms: 10 + 20 prompt tokens)."""
    cost = hand_cost(base_ms=10, per_prefill_token=1)
    trace = [TraceRequest(0.0, 30, 4), TraceRequest(0.045, 20, 2)]
    s = predict(trace, cost, Options(one_ahead=False)).summary
    # r0: tokens at 40, 50, 80, 90 ms; r1 at 80, 90 ms. Percentiles interpolate between
    # the two nearest ranks, as vLLM's benchmark does: TTFT 35 and 40 -> p50 37.5.
    assert s["ttft_p50_ms"] == pytest.approx(37.5) and s["ttft_p99_ms"] == pytest.approx(39.95)
    assert s["tpot_p99_ms"] == pytest.approx(10 + 0.99 * (50 / 3 - 10), abs=1e-3)
    assert s["tpot_p50_ms"] == pytest.approx((10 + 50 / 3) / 2, abs=1e-3)
    # The gaps: 10, 30, 10 (r0) and 10 (r1).
    assert s["itl_p99_ms"] == pytest.approx(10 + 0.97 * 20) and s["itl_p50_ms"] == pytest.approx(10)
    assert s["duration_s"] == pytest.approx(0.09)
    assert s["output_throughput"] == pytest.approx(6 / 0.09, rel=1e-3)
    assert s["peak_running"] == 2 and s["preemptions"] == 0
    # Step 4: r0 computes its 33rd token in a third block while r1 holds 2.
    assert s["peak_kv_blocks"] == 5


def test_async_scheduling_admits_a_step_later():
    """One step ahead (`folio serve`'s default): step 3 was planned when step 2 began
    (40 ms), before r1 arrived (45 ms), so r1 joins step 4, planned at 50 ms: r0's tokens at
    40, 50, 60, 90 ms; r1's at 90 (60-90: 10 + 20 prompt tokens) and 100."""
    cost = hand_cost(base_ms=10, per_prefill_token=1)
    trace = [TraceRequest(0.0, 30, 4), TraceRequest(0.045, 20, 2)]
    s = predict(trace, cost, Options(one_ahead=True)).summary
    # TTFT 40 (r0) and 45 (r1); TPOT (90 - 40) / 3 (r0) and 10 (r1).
    assert s["ttft_p50_ms"] == pytest.approx(42.5) and s["ttft_p99_ms"] == pytest.approx(44.95)
    assert s["tpot_p99_ms"] == pytest.approx(10 + 0.99 * (50 / 3 - 10), abs=1e-3)
    assert s["tpot_p50_ms"] == pytest.approx((10 + 50 / 3) / 2, abs=1e-3)
    assert s["duration_s"] == pytest.approx(0.1)


def test_shared_prefixes_hit_the_cache(tmp_path):
    trace = tmp_path / "trace.jsonl"
    trace.write_text("\n".join(
        f'{{"arrival": {i * 0.5}, "prompt_tokens": 96, "output_tokens": 4, '
        f'"prefix_id": "system", "prefix_tokens": 64}}' for i in range(6)))
    workload = parse_workload(str(trace))
    hits = predict(workload.trace(), hand_cost()).summary
    # Each request after the first finds the 64 prefix tokens (4 full blocks) cached.
    assert hits["prefix_hit_rate"] == pytest.approx(5 * 64 / (6 * 96), abs=1e-3)
    off = predict(workload.trace(), hand_cost(), Options(prefix_caching=False)).summary
    assert off["prefix_hit_rate"] == 0.0


def test_the_slo_search_brackets_the_highest_passing_rate():
    cost = hand_cost(base_ms=2, per_prefill_token=0.2, num_kv_blocks=256)
    workload = parse_workload("poisson:rate=2,n=40,prompt=64,output=16,seed=3")
    slo = parse_slo("ttft=150ms")
    found = search_rate(workload, cost, Options(), slo, 99)
    assert found.rate is not None and meets(found.result.summary, slo, 99)
    failing = [r.rate for r in found.tried if not meets(r.summary, slo, 99)]
    assert failing and min(failing) > found.rate
    assert min(failing) - found.rate < 0.05 * found.rate   # bisected close


def test_compare_sweeps_memory_and_policy(cost):
    names = [o.name for o in compare_options(cost)]
    assert names[0] == "calibrated"
    assert {"kv bfloat16", "kv int8", "block size 8", "block size 32",
            "prefix caching off", "contiguous, reserve 512"} <= set(names)
    trace = parse_workload("fixed:rate=50,n=12,prompt=100,output=40").trace()
    by_name = {o.name: predict(trace, cost, o).summary for o in compare_options(cost)}
    # 64 blocks of 16 = 1024 slots: paged runs several at once, reserving 512 two.
    assert by_name["contiguous, reserve 512"]["peak_running"] == 2
    assert by_name["calibrated"]["peak_running"] > 2
    # int8 KV: 256 / 80 bytes a token -> 3.2x the blocks in the same memory.
    assert by_name["kv int8"]["kv_blocks"] == 64 * 256 // 80


def test_a_p50_between_two_clusters_is_named():
    """Pairs of requests 250 ms apart, pairs 2 s apart: the first of a pair decodes beside
    the second's 200-token prompt step (TPOT about 30 ms), the second alone (10 ms), so the
    TPOT median of 12 falls between the two and the plan says so; spread out, it does not."""
    from folio.planner.command import table

    cost = hand_cost(base_ms=10, per_prefill_token=1)
    paired = [TraceRequest(2.0 * k + 0.25 * second, 200, 11) for k in range(6)
              for second in (0, 1)]
    s = predict(paired, cost, Options(one_ahead=False)).summary
    below, above = s["p50_between_clusters"]["tpot"]
    assert below == pytest.approx(10) and above > 25
    assert "ttft" not in s["p50_between_clusters"]
    plan = {"workload": "paired", "rate": 1.0, "requests": 12, "cost_file": "c.json",
            "machine": {}, "fit_error": {}, "slo": None, "slo_percentile": 99,
            "options": [{"option": "calibrated", "at_rate": s, "curve": []}]}
    assert "the TPOT p50 sits between two clusters of requests (10.0 and" in table(plan)
    apart = [TraceRequest(2.0 * k, 200, 11) for k in range(12)]
    assert predict(apart, cost, Options(one_ahead=False)).summary["p50_between_clusters"] == {}
