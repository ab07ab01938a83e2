"""bench/gpu_attention.py runs where it cannot be timed: --help, and a --dry-run on CPU."""

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
