"""bench/serve.py against a real `folio serve`, its variants' parsing, bench/throughput.py's
step times, and bench/peer.py's Folio-only path."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from bench.peer import compare_tokens
from bench.peer_floor import workload_flops
from bench.serve_client import check_loopback, percentiles
from bench.serve_variants import parse_variant
from tests.http_server import HttpServer

ROOT = Path(__file__).resolve().parents[2]
HAVE_MATPLOTLIB = importlib.util.find_spec("matplotlib") is not None
# bench/throughput.py's workload with one request: 23 prompt tokens, 16 output tokens.
PEER_SEED, PEER_PROMPT, PEER_OUTPUT = 1648, 23, 16


def _bench(*args: str, timeout: float = 120) -> subprocess.CompletedProcess:
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    return subprocess.run([sys.executable, *args], cwd=ROOT, env=env, capture_output=True,
                          text=True, timeout=timeout)


def _ordered(stats: dict) -> bool:
    return stats["p50"] <= stats["p90"] <= stats["p99"]


def test_percentiles_and_token_comparison():
    stats = percentiles([float(x) for x in range(1, 101)])
    assert stats["p50"] == pytest.approx(50.5) and stats["p99"] == pytest.approx(99.01)
    assert percentiles([])["p90"] is None
    match = compare_tokens([[1, 2, 3], [4, 5], [6, 7, 8]], [[1, 2, 3], [4, 9], [6, 7]])
    assert match == {"requests": 3, "exact": 1, "differ": 2,
                     "first_divergence_positions": [1, 2]}


def test_serve_variants_read_flags_and_environment():
    assert parse_variant("passive=--cpu-placement=shared,--cpu-threads=2;OMP_WAIT_POLICY=PASSIVE") \
        == ("passive", ["--cpu-placement=shared", "--cpu-threads=2"],
            {"OMP_WAIT_POLICY": "PASSIVE"})
    assert parse_variant("dp2=--data-parallel-size=2") == ("dp2", ["--data-parallel-size=2"], {})
    with pytest.raises(SystemExit, match="NAME=FLAG"):
        parse_variant("=--seed=1")


@pytest.fixture(scope="module")
def bench_model(tmp_path_factory) -> str:
    """bench/throughput.py's checkpoint, made once by the first bench that needs it."""
    return str(tmp_path_factory.mktemp("bench-model") / "model")


@pytest.mark.slow
def test_throughput_step_times_split_prompt_and_decode_steps(bench_model):
    run = _bench("bench/throughput.py", "--step-times", "--json", "--num-requests", "2",
                 "--model-dir", bench_model, timeout=300)
    assert run.returncode == 0, run.stderr[-2000:]
    times = json.loads(run.stdout)
    assert times["prefill_tokens"] > 0 and times["prefill_tok_per_s"] > 0
    assert times["decode_steps"] > 0 and times["decode_ms_median"] > 0


def test_floor_flops_by_hand():
    shape = dict(hidden_size=8, num_heads=2, num_kv_heads=1, intermediate_size=16,
                 vocab_size=32, num_layers=1)
    # q 8x8, k and v 8x4 each, o 8x8, gate/up/down 3 x 8x16.
    params = 64 + 32 + 32 + 64 + 384
    flops = workload_flops(shape, [[5, 6]], [2])   # 3 forward positions, 2 sampled
    assert flops["non_embedding_params"] == params
    assert flops["linear"] == 2 * params * 3
    assert flops["lm_head"] == 2 * 8 * 32 * 2
    assert flops["attention"] == 4 * 8 * (1 + 2 + 3)
    assert flops["prefill_phase"] + flops["decode_phase"] == flops["total"]


def test_serve_bench_refuses_remote_servers():
    with pytest.raises(SystemExit, match="loopback"):
        check_loopback("http://192.0.2.1:8000")
    check_loopback("http://127.0.0.1:8000")


@pytest.mark.slow
def test_serve_bench_against_folio_serve(llama_dir, tmp_path):
    server = HttpServer(llama_dir, tmp_path, "--num-kv-blocks", "128")
    try:
        server.wait_ready()
        out = tmp_path / "folio.json"
        done = _bench("bench/serve.py", "run", "--base-url", server.base, "--label", "folio",
                      "--vocab-size", "1024", "--num-prompts", "4", "--input-len", "16",
                      "--output-len", "6", "--max-concurrency", "2", "-o", str(out))
        assert done.returncode == 0, done.stderr[-2000:]
        text_out = tmp_path / "text.json"
        done = _bench("bench/serve.py", "run", "--base-url", server.base, "--num-prompts", "2",
                      "--input-len", "12", "--output-len", "3", "--prompt-format", "text",
                      "--model-dir", str(llama_dir), "--request-rate", "50",
                      "-o", str(text_out))
        assert done.returncode == 0, done.stderr[-2000:]
    finally:
        server.stop()
    report = json.loads(out.read_text())
    assert (report["num_prompts"], report["completed"], report["failed"]) == (4, 4, 0)
    assert report["total_output_tokens"] == 4 * 6
    assert report["total_input_tokens"] == 4 * 16
    assert report["max_concurrency"] == 2 and report["request_rate"] is None
    assert report["output_throughput"] > 0 and report["request_throughput"] > 0
    for key in ("ttft_ms", "tpot_ms", "itl_ms", "e2e_ms"):
        assert _ordered(report[key]), (key, report[key])
    assert report["ttft_ms"]["p99"] <= report["e2e_ms"]["p99"]
    text = json.loads(text_out.read_text())
    assert (text["completed"], text["total_output_tokens"]) == (2, 6)
    assert text["request_rate"] == 50 and text["prompt_format"] == "text"
    if HAVE_MATPLOTLIB:
        png = tmp_path / "serve.png"
        done = _bench("bench/serve.py", "plot", str(out), str(text_out), "-o", str(png))
        assert done.returncode == 0, done.stderr[-2000:]
        assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def _processes_mentioning(text: str) -> list[int]:
    found = []
    for proc in Path("/proc").iterdir():
        try:
            if proc.name.isdigit() and text in (proc / "cmdline").read_bytes().decode(
                    errors="replace"):
                found.append(int(proc.name))
        except OSError:
            continue
    return found


@pytest.mark.slow
def test_serve_race_folio_only(llama_dir, tmp_path):
    out_dir = tmp_path / "race"
    done = _bench("bench/serve.py", "race", "--skip-vllm", "--serve-model-dir", str(llama_dir),
                  "--concurrency", "1", "2", "--num-prompts", "2", "--input-len", "8",
                  "--output-len", "4", "--out-dir", str(out_dir), timeout=180)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    results = json.loads((out_dir / "folio.json").read_text())["results"]
    assert [(r["label"], r["round"], r["max_concurrency"]) for r in results] == [
        ("folio", 1, 1), ("folio", 1, 2)]
    assert [r["completed"] for r in results] == [2, 2]
    assert all(r["total_output_tokens"] == 8 for r in results)
    assert results[0]["seed"] != results[1]["seed"]   # fresh prompts per load
    assert not (out_dir / "vllm.json").exists()
    assert (out_dir / "serve-race.png").exists() == HAVE_MATPLOTLIB
    assert _processes_mentioning(str(out_dir)) == []   # the server and its children stopped


@pytest.mark.slow
def test_peer_folio_only(tmp_path, bench_model):
    out = tmp_path / "peer"
    done = _bench("bench/peer.py", "--skip-vllm", "--rounds", "2", "--num-requests", "1",
                  "--seed", str(PEER_SEED), "--matmul-gflops", "100",
                  "--model-dir", bench_model, "--out", str(out))
    assert done.returncode == 0, done.stderr[-2000:]
    report = json.loads(out.with_suffix(".json").read_text())
    assert (report["requests"], report["prompt_tokens"], report["output_tokens"]) == (
        1, PEER_PROMPT, PEER_OUTPUT)
    assert [(r["engine"], r["round"]) for r in report["rounds"]] == [("folio", 1), ("folio", 2)]
    for figure in report["rounds"]:
        assert figure["output_tokens"] == PEER_OUTPUT and figure["tok_per_s"] > 0
        assert figure["loadavg_1m_before"] >= 0
    assert report["same_tokens_every_round"] == {"folio": True}   # greedy, fresh processes
    assert report["floor"]["rate"]["decode_gflops"] == 100
    assert 0 < report["fraction_of_floor"]["folio"]
    assert "vllm" not in report["median_tok_per_s"]
    assert out.with_suffix(".png").exists() == HAVE_MATPLOTLIB


def test_peer_without_vllm_python_says_so(tmp_path):
    done = _bench("bench/peer.py", "--vllm-python", str(tmp_path / "nowhere" / "python"),
                  "--out", str(tmp_path / "peer"), timeout=60)
    assert done.returncode != 0
    assert "--skip-vllm" in done.stderr and "does not exist" in done.stderr
    assert not (tmp_path / "peer.json").exists()


def test_lora_kernel_bench_compares_equal_forms():
    # bench/lora.py kernel: the grouped and the bmm forms must agree before they are timed.
    out = _bench("-m", "bench.lora", "kernel", "--repeat", "1", "--hidden", "64", "--out",
                 "96", "--rank", "4")
    assert out.returncode == 0, out.stderr
    rows = [json.loads(line) for line in out.stdout.splitlines()]
    assert [(r["tokens"], r["adapters"]) for r in rows] == [
        (t, a) for t in (32, 256) for a in (1, 4, 8)]
    assert all(r["grouped_ms"] > 0 and r["bmm_ms"] > 0 for r in rows)


def test_startup_bench_times_a_start_and_a_stop():
    done = _bench("bench/startup.py", "--rounds", "1")
    assert done.returncode == 0, done.stderr[-2000:]
    lines = [json.loads(line) for line in done.stdout.splitlines()]
    figures = lines[0]
    assert figures["ready_s"] > 0 and figures["stopped_s"] > 0
    assert {"serve_cpu_s", "scheduler_cpu_s", "executor_cpu_s", "frontend_cpu_s"} <= set(figures)
    assert lines[-1]["median"]["ready_s"] == figures["ready_s"]
