"""A short chaos soak (tests/soak/chaos.py): mixed SDK and HTTP load while processes are
stopped; every request ends once with its right answer or a clear error, no block leaks, and
the answers after the chaos are the answers before it."""

from __future__ import annotations

import json

import pytest

from tests.processes.cluster import running_cluster
from tests.soak.chaos import SoakSettings, run_soak

NUM_KV_BLOCKS = 256


@pytest.fixture
def cluster(tmp_path_factory, llama_dir):
    yield from running_cluster(tmp_path_factory, llama_dir, NUM_KV_BLOCKS)


@pytest.mark.slow
def test_a_short_chaos_soak_loses_and_mixes_up_nothing(cluster):
    # Stops only: a restart (imports torch) would take most of the run.
    settings = SoakSettings(seconds=5, clients=4, prompts=6, fault_gap=2, faults=(
        "stop-executor", "stop-frontend1", "stop-frontend0", "stop-scheduler"))
    summary = run_soak(cluster, settings)
    assert summary["passed"], json.dumps(summary, indent=1)
    assert summary["requests"] > 0 and sum(summary["faults"].values()) >= 1
    assert summary["outcomes"].get("ok", 0) > 0
    assert summary["leaked_blocks"] == 0 and summary["after_chaos"] == {"ok": 6}
