"""bench/cpu_attention.py --kv-cache and --decode and bench/quantized_decode.py's modes, run
small: what they print, not how fast."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from folio.kernels import cpu_attention

ROOT = Path(__file__).resolve().parents[2]
# Tokens per GiB of SmolLM2-135M's KV cache (docs/benchmarks.md, "Quantized KV cache").
TOKENS_PER_GIB = {"float32": 23301, "bfloat16": 46603, "int8": 90382, "fp8_e4m3": 93206,
                  "fp8_e5m2": 93206}


@pytest.fixture(scope="module", autouse=True)
def cpu_operators():
    status = cpu_attention.load()
    if not status.ok:
        pytest.skip(f"the CPU operators are unavailable here: {status.detail}")


def _bench(*args: str, timeout: float = 300) -> str:
    run = subprocess.run([sys.executable, *args], cwd=ROOT, capture_output=True, text=True,
                         env=dict(os.environ, PYTHONPATH=str(ROOT)), timeout=timeout)
    assert run.returncode == 0, run.stdout[-2000:] + run.stderr[-2000:]
    return run.stdout


def test_kv_cache_table_gives_each_type_its_capacity_and_error():
    out = _bench("-m", "bench.cpu_attention", "--kv-cache", "--rounds", "1", "--reps", "1",
                 "--threads", "1", "--batch", "2", "--context", "64")
    rows = {line.split()[0]: line.split() for line in out.splitlines()
            if line.split() and line.split()[0] in TOKENS_PER_GIB}
    assert {name: int(row[-1]) for name, row in rows.items()} == TOKENS_PER_GIB
    assert float(rows["float32"][4]) == 0.0   # the float32 cache is the reference
    assert all(0.0 < float(row[4]) < 0.5 for name, row in rows.items() if name != "float32")


def test_decode_table_times_each_case_hot_and_from_memory():
    out = _bench("-m", "bench.cpu_attention", "--decode", "--batches", "1", "2", "--contexts",
                 "16", "40", "--dtypes", "bfloat16", "--rounds", "1", "--reps", "1",
                 "--threads", "1")
    rows = [line.split() for line in out.splitlines() if line.startswith("bfloat16")]
    assert [row[1:4] for row in rows] == [["1", "16", "1"], ["1", "40", "1"], ["2", "16", "1"],
                                          ["2", "40", "1"]]
    assert all(float(cell) > 0 for row in rows for cell in row[4:8])
    caches = [int(row[8]) for row in rows]   # copies cycled: more of smaller ones
    assert caches[0] > caches[1] > caches[3] >= 2 and caches[0] > caches[2]


@pytest.mark.slow
def test_model_pass_times_every_weight_and_activation_kind():
    out = _bench("bench/quantized_decode.py", "--model-pass", "--rows", "1", "--repeat", "1",
                 "--cpu-threads", "1")
    line = next(line for line in out.splitlines() if line.startswith("model pass M=1"))
    assert [cell for cell in line.split() if cell.startswith("int")] == [
        "int8", "int8", "int4", "int4"]
    assert line.count("a8") == 2


@pytest.mark.slow
def test_decode_runs_alternate_quantizations_and_kv_cache_types(llama_dir):
    # Two engines (each run starts one): the quantized weights beside a quantized cache, and
    # neither, show both axes alternate and report.
    out = _bench("bench/quantized_decode.py", "--model-dir", str(llama_dir), "--pairs",
                 "none:auto", "int8:int8", "--rounds", "1",
                 "--users", "2", "--prompt-len", "16", "--output-len", "4", "--num-kv-blocks",
                 "32", "--cpu-threads", "1")
    runs = [json.loads(line) for line in out.splitlines()]
    assert [(r["quantization"], r["kv_cache_dtype"]) for r in runs] == [
        ("none", "auto"), ("int8", "int8")]
    assert [r["quantized_layers"] > 0 for r in runs] == [False, True]
    assert all("one_user_tok_s" in r and "2_users_tok_s" in r for r in runs)
