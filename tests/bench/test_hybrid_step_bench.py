"""bench/hybrid_step.py run tiny: one table row per (users, hybrid path: recurrent steps in
torch, in C++, the native step) with both models' step times and their ratio, and the
parameter counts; with --prefill, one row per prompt path and the ratios (what it prints,
not how fast)."""

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


PREFILL_ROW = re.compile(r"^\s+(torch|C\+\+)\s+([\d.]+)\s+([\d.]+)$")


def test_prefill_prints_both_prompt_paths_and_their_ratio(capsys):
    status = cpu_attention.load()
    if not status.ok:
        pytest.skip(f"the CPU operators are unavailable here: {status.detail}")
    hybrid_step.main(["--tiny", "--steps", "1", "--users", "2", "--prefill", "20"])
    lines = capsys.readouterr().out.splitlines()
    assert re.search(r"2 prompts x 20 tokens.*4 heads x 16 x 16; load average [\d.]+ ", lines[0])
    rows = [PREFILL_ROW.match(line) for line in lines[2:4]]
    assert all(rows) and [row[1] for row in rows] == ["torch", "C++"]
    assert all(float(row[2]) > 0 and float(row[3]) > 0 for row in rows)
    assert re.match(r"torch / C\+\+: step [\d.]+x, delta rule [\d.]+x$", lines[4])
