"""bench/spec_decode_served.py on the tiny llama, speculation off and n-gram: each mode's
server started and stopped through bench/serve_process.py, every answer the same in both."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.slow
def test_off_and_ngram_give_the_same_answers(llama_dir, tmp_path):
    out = tmp_path / "runs.jsonl"
    run = subprocess.run(
        [sys.executable, "-m", "bench.spec_decode_served", "--model", str(llama_dir),
         "--modes", "off", "ngram", "--rounds", "1", "--concurrency", "2",
         "--max-tokens", "8", "--random-len", "16", "--chars", "200", "--out", str(out)],
        cwd=ROOT, env=dict(os.environ, PYTHONPATH=str(ROOT)), capture_output=True, text=True,
        timeout=300)
    assert run.returncode == 0, run.stdout[-2000:] + run.stderr[-3000:]
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    assert [(r["mode"], r["workload"], r["concurrency"]) for r in rows] == [
        (mode, workload, 2) for mode in ("off", "ngram") for workload in ("copy", "random")]
    assert all(r["identical"] == f"{r['concurrency']}/{r['concurrency']}" for r in rows)
