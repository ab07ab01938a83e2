"""The benches bench/gpu_check.sh runs, where they cannot be timed: bench/gpu_attention.py's
--help and a --dry-run on CPU, bench/moe_gpu.py and bench/gated_delta_gpu.py as a --dry-run
on CPU (the interpreter)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[2]
SCRIPT = REPO_ROOT / "bench" / "gpu_attention.py"


def test_help():
    result = subprocess.run([sys.executable, str(SCRIPT), "--help"], capture_output=True,
                            text=True, timeout=60, check=True)
    assert "--budget-s" in result.stdout


def test_dry_run_on_cpu(tmp_path):
    report = tmp_path / "rows.json"
    subprocess.run([sys.executable, str(SCRIPT), "--dry-run", "--quick", "--json", str(report)],
                   cwd=tmp_path, timeout=120, check=True, capture_output=True)
    rows = json.loads(report.read_text())
    assert [r["kind"] for r in rows] == ["copy"] + ["decode"] * 2 + ["prefill"] * 2
    assert all(r["max_rel_err"] < 1e-2 for r in rows[1:])


def test_moe_gpu_dry_run(tmp_path):
    report = tmp_path / "rows.json"
    subprocess.run([sys.executable, str(REPO_ROOT / "bench" / "moe_gpu.py"), "--dry-run",
                    "--json", str(report)], cwd=tmp_path, timeout=120, check=True,
                   capture_output=True)
    rows = json.loads(report.read_text())
    assert [(r["kind"], r["tokens"]) for r in rows] == [("case", 1), ("case", 9), ("sweep", 1)]
    assert all(r["max_rel_err"] < 1e-5 and r["kernel_us"] > 0 for r in rows)


def test_gated_delta_gpu_dry_run(tmp_path):
    report = tmp_path / "rows.json"
    subprocess.run([sys.executable, str(REPO_ROOT / "bench" / "gated_delta_gpu.py"),
                    "--dry-run", "--json", str(report)], cwd=tmp_path, timeout=120,
                   check=True, capture_output=True)
    rows = json.loads(report.read_text())
    assert [r["tokens"] for r in rows] == [1, 17]
    assert all(r["out_rel_err"] < 1e-5 and r["state_rel_err"] < 1e-5 and r["kernel_us"] > 0
               for r in rows)
