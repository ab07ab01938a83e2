"""bench/quality.py end to end on the tiny llama: the JSON's shape and sense, not speed."""

from __future__ import annotations

import json
import math
import subprocess
import sys
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[2] / "bench" / "quality.py"


def run_quality(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(SCRIPT), *args], capture_output=True,
                          text=True, timeout=300)


def test_float32_agrees_with_itself_and_perplexities_are_finite(llama_dir):
    # int4 is the same script path as int8 (one more quantization): two paths show it.
    done = run_quality("--model-dir", str(llama_dir), "--paths", "float32", "int8",
                       "--windows", "2", "--window-len", "32", "--prompts", "2",
                       "--prompt-len", "8", "--gen-len", "4", "--json")
    assert done.returncode == 0, done.stderr
    results = {r["path"]: r for r in json.loads(done.stdout)["results"]}
    assert set(results) == {"float32", "int8"}
    assert results["float32"]["agree_prefix"] == 1.0
    assert results["float32"]["agree_overall"] == 1.0
    for result in results.values():
        assert "error" not in result
        assert math.isfinite(result["perplexity"]) and result["perplexity"] > 1
        assert result["scored_tokens"] == 2 * 31
        assert 0.0 <= result["agree_overall"] <= 1.0
        assert [len(tokens) for tokens in result["generated"]] == [4, 4]


@pytest.mark.parametrize("args", [["--paths", "float16"], ["--windows", "0"],
                                  ["--prompts", "9"]])
def test_bad_flags_get_a_one_line_error(args):
    done = run_quality(*args)
    assert done.returncode == 2
    assert "Traceback" not in done.stderr and "error:" in done.stderr
