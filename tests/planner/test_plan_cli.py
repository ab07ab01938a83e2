"""`folio plan` from the command line: calibrate --quick on a tiny checkpoint writes a cost
file a plan reads (table, JSON, PNG); bad workloads, SLOs and cost files are refused in one
line naming the flag, exit 2."""

from __future__ import annotations

import json

import pytest

from folio.cli import main
from folio.planner.cost import FEATURES, load_cost


@pytest.fixture(scope="module")
def cost_file(llama_dir, tmp_path_factory):
    path = tmp_path_factory.mktemp("plan") / "cost.json"
    assert main(["plan", "calibrate", "--quick", "--model", str(llama_dir), "--cost",
                 str(path), "--num-kv-blocks", "128", "--cpu-threads", "1"]) == 0
    return path


def test_calibrate_quick_writes_a_cost_file(cost_file, llama_dir):
    cost = load_cost(cost_file)
    assert cost.model == str(llama_dir) and cost.kv.num_kv_blocks == 128
    assert cost.kv.kv_cache_dtype == "float32" and cost.flags["num_kv_blocks"] == 128
    assert set(cost.executor_ms) == set(FEATURES)
    assert cost.fit_error["steps"] >= 5 and cost.date and cost.machine["cores"] >= 1
    # Some step costs something: the fit is of real, non-zero times.
    assert sum(cost.executor_ms.values()) > 0 and cost.hop_ms > 0
    # The served part: `folio serve` really streamed the trickle and each round, measured
    # beside the in-process prediction of the same requests.
    assert cost.served is not None and cost.vocab_size > 0
    assert [r["concurrency"] for r in cost.served.rounds] == [4]
    assert cost.served.trickle["requests"] == 3
    assert cost.served.trickle["tpot_p50_ms"] > 0 and cost.served.trickle["ttft_p50_ms"] > 0
    for measured in cost.served.rounds:
        assert measured["ttft_ms"] > 0 and measured["tpot_ms"] > 0
        assert measured["predicted_tpot_ms"] > 0


def test_plan_prints_saves_and_plots(cost_file, tmp_path, capsys):
    saved, png = tmp_path / "plan.json", tmp_path / "plan.png"
    assert main(["plan", "--cost", str(cost_file), "--workload",
                 "poisson:rate=20,n=12,prompt=16-48,output=8,prefix=16,prefixes=2",
                 "--compare", "--slo", "tpot=1s", "--slo-percentile", "50",
                 "--save", str(saved), "--plot", str(png)]) == 0
    out = capsys.readouterr().out
    assert "TPOT p50/p90/p99 ms" in out and "contiguous, reserve" in out
    plan = json.loads(saved.read_text())
    assert plan["slo"] == {"tpot": 1000.0} and plan["slo_percentile"] == 50
    names = [entry["option"] for entry in plan["options"]]
    assert names[0] == "calibrated" and "prefix caching off" in names
    calibrated = plan["options"][0]
    assert calibrated["at_rate"]["requests"] == 12 and calibrated["max_rate"] > 0
    assert calibrated["at_rate"]["prefix_hit_rate"] > 0
    assert len(calibrated["curve"]) > 3
    assert png.read_bytes()[:4] == b"\x89PNG"


@pytest.mark.parametrize("argv, flag, problem", [
    (["--workload", "poison:rate=1,n=2,prompt=3,output=4"], "--workload", "not poisson"),
    (["--workload", "poisson:rate=0,n=2,prompt=3,output=4"], "--workload", "rate > 0"),
    (["--workload", "poisson:rate=1,n=2,prompt=3"], "--workload", "give output"),
    (["--workload", "fixed:rate=1,n=2,prompt=9-3,output=4"], "--workload", "LO <= HI"),
    (["--workload", "fixed:rate=1,n=2,prompt=8,output=4,colour=red"], "--workload",
     "unknown key 'colour'"),
    (["--workload", "fixed:rate=1,n=2,prompt=8,output=4", "--slo", "tpot=fast"], "--slo",
     "not a time"),
    (["--workload", "fixed:rate=1,n=2,prompt=8,output=4", "--slo", "latency=1s"], "--slo",
     "'latency' is not one of"),
    (["--workload", "fixed:rate=1,n=2,prompt=5000,output=4"], "--workload",
     "longer than max_model_len"),
])
def test_bad_workloads_and_slos_are_refused(cost_file, capsys, argv, flag, problem):
    assert main(["plan", "--cost", str(cost_file), *argv]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and err.startswith(f"folio plan: error: {flag} ")
    assert problem in err


def test_bad_cost_files_are_refused(cost_file, tmp_path, capsys):
    good = json.loads(cost_file.read_text())
    broken = {"not JSON": "{",
              "not a folio-plan-cost/1 file": json.dumps({**good, "format": "x"}),
              "missing executor_ms.per_decode_row": json.dumps(
                  {**good, "executor_ms": {k: v for k, v in good["executor_ms"].items()
                                           if k != "per_decode_row"}}),
              "hop_ms is negative": json.dumps({**good, "hop_ms": -1}),
              "served.request_ms is negative": json.dumps(
                  {**good, "served": {**good["served"], "request_ms": -2}}),
              "kv.num_kv_blocks is not a number": json.dumps(
                  {**good, "kv": {**good["kv"], "num_kv_blocks": "many"}}),
              "cannot read it": None}
    for problem, text in broken.items():
        path = tmp_path / "cost.json"
        if text is None:
            path.unlink()
        else:
            path.write_text(text)
        assert main(["plan", "--cost", str(path), "--workload",
                     "fixed:rate=1,n=2,prompt=8,output=4"]) == 2, problem
        err = capsys.readouterr().err.strip()
        assert len(err.splitlines()) == 1 and err.startswith("folio plan: error: --cost ")
        assert problem in err
