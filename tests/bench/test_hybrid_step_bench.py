"""bench/hybrid_step.py run tiny: one table row per (users, hybrid path: recurrent steps in
torch, in C++, the native step) with both models' step times and their ratio, and the
parameter counts (what it prints, not how fast)."""

from __future__ import annotations

import re

import pytest

from bench import hybrid_step
from folio.kernels import cpu_attention

ROW = re.compile(r"^\s+(\d+)\s+(torch|C\+\+|native)\s+([\d.]+)\s+([\d.]+)\s+([\d.]+)"
                 r"\s+(met|missed)$")


def test_prints_one_row_per_users_and_path(capsys):
    status = cpu_attention.load()
    if not status.ok:
        pytest.skip(f"the CPU operators are unavailable here: {status.detail}")
    hybrid_step.main(["--tiny", "--steps", "1", "--warmup", "0", "--users", "1,3",
                      "--context", "20"])
    lines = capsys.readouterr().out.splitlines()
    assert re.search(r"parameters: full 0\.\dM, hybrid 0\.\dM", lines[0])
    rows = [ROW.match(line) for line in lines[2:]]
    assert all(rows) and [(r[1], r[2]) for r in rows] == [
        ("1", "torch"), ("1", "C++"), ("1", "native"), ("3", "torch"), ("3", "C++"),
        ("3", "native")]
    # The full model is the same in every path: one time per user count.
    assert len({row[3] for row in rows[:3]}) == 1 and len({row[3] for row in rows[3:]}) == 1
    assert all(float(row[3]) > 0 and float(row[4]) > 0 for row in rows)
