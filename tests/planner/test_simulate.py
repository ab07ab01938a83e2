"""`folio simulate`: the two worked examples and a small trace, against counts made by hand
(the rounds each request is admitted and finishes in, queueing delays, preemptions)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from folio.planner.simulator.command import lockers, rounds
from folio.planner.simulator.inputs import Machine, TraceRequest, load_trace
from folio.planner.simulator.run import compare, percentile, simulate

ROOT = Path(__file__).resolve().parents[2]


def test_lockers_who_gets_in_and_who_waits():
    paged, reserve_12, true_max = lockers()[0]
    first = {run.name: sorted(n for n, step in run.admitted_step.items() if step == 1)
             for run in (paged, reserve_12, true_max)}
    # 15 blocks of 4: seven users of two blocks each; 60 // 12 = 5 and 60 // 9 = 6 reserved.
    assert first[paged.name] == [f"u{i}" for i in range(1, 8)]
    assert first[reserve_12.name] == [f"u{i}" for i in range(1, 6)]
    assert first[true_max.name] == [f"u{i}" for i in range(1, 7)]
    assert paged.admitted_step["u8"] == reserve_12.admitted_step["u6"] == 5
    assert [r.peak_running for r in (paged, reserve_12, true_max)] == [7, 5, 6]
    # Each user holds 5, 6, 7, 8 of its slots over its four rounds: of 2 blocks (8 slots)
    # paged, of 12 reserved.
    assert paged.summary()["slot_utilization"] == pytest.approx(26 / 32, abs=1e-4)
    assert reserve_12.summary()["slot_utilization"] == pytest.approx(26 / 48, abs=1e-4)
    assert all(run.preemptions == 0 and run.steps == 8 for run in (paged, reserve_12))


def test_rounds_static_8_iteration_level_6():
    iteration, static = rounds()[0]
    assert (iteration.steps, static.steps) == (6, 8)
    spans = {n: (iteration.admitted_step[n], iteration.finished_step[n]) for n in "ABCDEF"}
    assert spans == {"A": (1, 6), "B": (1, 2), "C": (1, 2), "D": (3, 4), "E": (3, 4),
                     "F": (5, 6)}
    assert [static.admitted_step[n] for n in "ABCDEF"] == [1, 1, 1, 7, 7, 7]


def test_small_trace_against_a_hand_count():
    """4 blocks of 4 slots, 10 ms a step. Counted by hand:
    step 1 (t=0)   r0 (6 tokens, 2 blocks) and r1 (4, 1 block) in; r2 arrives at 15 ms.
    step 2         r1 grows to 2 blocks: the pool is full.
    step 3 (20 ms) r2 waits (needs 2 blocks); r0 ends (3 outputs) and frees 2.
    step 4 (30 ms) r2 in (queued 15 ms).
    step 5         r2 needs a third block: it is the newest, so it is preempted; r1 ends.
    step 6 (50 ms) r2 back (9 tokens, 3 blocks) and ends. Drained at 60 ms."""
    trace = [TraceRequest(0.0, 6, 3), TraceRequest(0.0, 4, 5), TraceRequest(0.015, 8, 2)]
    machine = Machine(num_kv_blocks=4, block_size=4, max_model_len=16, ms_per_step=10)
    run = simulate(trace, machine)
    assert run.admitted_step == {"0": 1, "1": 1, "2": 4}
    assert run.finished_step == {"0": 3, "1": 5, "2": 6}
    assert (run.steps, run.preemptions, run.peak_running, run.peak_blocks) == (6, 1, 2, 4)
    assert run.queue_delays == pytest.approx([0.0, 0.0, 0.015])
    assert run.clock == pytest.approx(0.06)
    # Reserving 16 slots (max_model_len), or the longest request's 10: one at a time.
    # r0 steps 1-3, r1 4-8, r2 9-10.
    _, reserve_16, reserve_10 = compare(trace, machine)
    for reserved in (reserve_16, reserve_10):
        assert reserved.finished_step == {"0": 3, "1": 8, "2": 10}
        assert reserved.queue_delays == pytest.approx([0.0, 0.03, 0.065])
        assert (reserved.steps, reserved.preemptions, reserved.peak_running) == (10, 0, 1)
    assert percentile(reserve_16.queue_delays, 50) == pytest.approx(0.03)


def test_token_cost_and_shared_prefix():
    trace = [TraceRequest(0.0, 16, 2, prefix="system")] * 2
    machine = Machine(num_kv_blocks=8, block_size=4, max_model_len=32, ms_per_step=1,
                      tokens_per_s=1000)
    run = simulate(trace, machine)
    # Step 1: the first takes 4 full blocks; the second shares 3 (one token is always left
    # to compute) and takes 1: 5 blocks, 16 + 4 tokens computed (1 + 20 ms). Step 2: each
    # computes its 17th token in a fifth block of its own.
    assert [point[1] for point in run.timeline] == [5, 7]
    assert run.timeline[0][0] == pytest.approx(0.021)
    assert run.steps == 2 and run.clock == pytest.approx(0.021 + 0.003)


def test_cli_reads_a_trace_and_writes_plots(tmp_path):
    lines = [{"arrival": 0.01 * i, "prompt_tokens": 20, "output_tokens": 5} for i in range(6)]
    trace = tmp_path / "trace.jsonl"
    trace.write_text("\n".join(map(json.dumps, lines)))
    assert len(load_trace(trace)) == 6
    result = subprocess.run(
        [sys.executable, "-m", "folio", "simulate", str(trace), "--num-kv-blocks", "16",
         "--block-size", "4", "--max-model-len", "32", "--json", "--plot-dir",
         str(tmp_path / "plots")], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    summaries = json.loads(result.stdout[:result.stdout.rindex("]") + 1])
    assert [s["policy"] for s in summaries][0] == "paged"
    assert summaries[0]["peak_running"] > summaries[1]["peak_running"]   # 64 // 32 = 2
    for name in ("kv_blocks.png", "running.png"):
        assert (tmp_path / "plots" / name).read_bytes()[:4] == b"\x89PNG"
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"arrival": 0, "prompt_tokens": 40, "output_tokens": 1}\n')
    result = subprocess.run(
        [sys.executable, "-m", "folio", "simulate", str(bad), "--num-kv-blocks", "16",
         "--max-model-len", "32"], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert result.returncode != 0 and "longer than max_model_len" in result.stderr


def test_gpu_memory_with_a_model_config(tmp_path):
    config = {"architectures": ["LlamaForCausalLM"], "vocab_size": 1000, "hidden_size": 256,
              "num_hidden_layers": 4, "num_attention_heads": 8, "num_key_value_heads": 2,
              "intermediate_size": 512, "max_position_embeddings": 4096,
              "torch_dtype": "bfloat16"}
    (tmp_path / "config.json").write_text(json.dumps(config))
    trace = tmp_path / "trace.jsonl"
    trace.write_text(json.dumps({"arrival": 0, "prompt_tokens": 100, "output_tokens": 10}))
    # K and V x 4 layers x 16 slots x 2 KV heads x 32 dims x 2 bytes = 16 KiB a block.
    result = subprocess.run(
        [sys.executable, "-m", "folio", "simulate", str(trace), "--model", str(tmp_path),
         "--gpu-memory", "0.0625", "--json"], cwd=ROOT, capture_output=True, text=True,
        timeout=120)
    assert result.returncode == 0, result.stderr
    paged, reserve_max, _ = json.loads(result.stdout)
    assert paged["blocks"] == 4096   # 64 MiB / 16 KiB
    assert reserve_max["policy"] == "contiguous, reserve max_model_len=4096"   # the model's
    assert reserve_max["blocks"] == 16   # 65 536 slots / 4096
