"""bench/moe_gpu.py runs where it cannot be timed: a --dry-run on CPU through the interpreter."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[2]


def test_moe_gpu_dry_run(tmp_path):
    report = tmp_path / "rows.json"
    subprocess.run([sys.executable, str(REPO_ROOT / "bench" / "moe_gpu.py"), "--dry-run",
                    "--json", str(report)], cwd=tmp_path, timeout=120, check=True,
                   capture_output=True)
    rows = json.loads(report.read_text())
    assert [(r["kind"], r["tokens"]) for r in rows] == [("case", 1), ("case", 9)]
    assert all(r["max_rel_err"] < 1e-5 and r["kernel_us"] > 0 for r in rows)
