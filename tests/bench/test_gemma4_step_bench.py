"""bench/gemma4_step.py run tiny: one line per path (Python layers, native step) with a time,
the ratio, and the same tokens from both (what it prints, not how fast)."""

from __future__ import annotations

import re

import pytest

from bench import gemma4_step
from folio.kernels import cpu_attention


def test_prints_both_paths_and_the_same_tokens(capsys):
    status = cpu_attention.load()
    if not status.ok:
        pytest.skip(f"the CPU operators are unavailable here: {status.detail}")
    gemma4_step.main(["--tiny", "--tokens", "4", "--repeats", "1"])
    lines = capsys.readouterr().out.splitlines()
    assert re.match(r"parameters: 0\.\dM, float32, one user, 4 tokens", lines[0])
    rows = [re.match(r"^\s+(Python layers|native step)\s+([\d.]+) ms/token$", line)
            for line in lines[1:3]]
    assert all(rows) and [r[1] for r in rows] == ["Python layers", "native step"]
    assert all(float(r[2]) > 0 for r in rows)
    assert re.match(r"^\s+ratio [\d.]+x, same tokens: yes$", lines[3])
