"""The MoE bench scripts run: moe_gpu.py as a --dry-run on CPU (the interpreter), moe_cpu.py --quick."""

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
    assert [(r["kind"], r["tokens"]) for r in rows] == [("case", 1), ("case", 9), ("sweep", 1)]
    assert all(r["max_rel_err"] < 1e-5 and r["kernel_us"] > 0 for r in rows)


def test_moe_cpu_quick():
    result = subprocess.run([sys.executable, "-m", "bench.moe_cpu", "--quick",
                             "--variants", "dense", "grouped", "cpu"], cwd=REPO_ROOT,
                            timeout=120, check=True, capture_output=True, text=True)
    lines = result.stdout.splitlines()
    assert lines[0].startswith("# load average") and "float32" in lines[0]
    rows = [line.split() for line in lines[2:]]
    assert [(r[0], r[1]) for r in rows] == [("tiny", "1"), ("tiny", "64")]
    assert all(r[-1] in ("dense", "grouped", "cpu") for r in rows)
