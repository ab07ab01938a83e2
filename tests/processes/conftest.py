"""The reliability cluster's fixtures (tests/processes/cluster.py): one cluster for the whole
package's reliability files, healed before each test that asks for `healthy`."""

from __future__ import annotations

import pytest

from tests.processes.cluster import running_cluster
from tests.processes.tp_references import GreedyReferences


@pytest.fixture(scope="package")
def cluster(tmp_path_factory, llama_dir):
    yield from running_cluster(tmp_path_factory, llama_dir)


@pytest.fixture(scope="package")
def long_cluster_processes(tmp_path_factory, long_llama_dir):
    yield from running_cluster(tmp_path_factory, long_llama_dir, 4096)


@pytest.fixture
def long_cluster(long_cluster_processes):
    """The same processes on a 32768-token model with room for three ENDLESS answers, for a
    test whose requests must run on for as long as the test takes to look (the tests that
    use it stop or flood its processes: healed before each, and idle, or that test fails)."""
    cluster = long_cluster_processes
    cluster.heal()
    stats = cluster.wait_idle(0, 60.0)
    if stats["num_running"] or stats["num_waiting"] or \
            stats["kv_blocks_free"] != stats["kv_blocks_total"]:
        pytest.fail(f"an earlier test left work on the long cluster: {stats}")
    return cluster


@pytest.fixture
def healthy(cluster):
    cluster.heal()
    return cluster


@pytest.fixture(scope="session")
def tp_references() -> GreedyReferences:
    """The tensor-parallel tests' greedy references, each computed once for the session."""
    from tests.hf_oracle import hf_greedy
    from tests.processes.test_tensor_parallel import MAX_TOKENS, PROMPTS, one_rank

    return GreedyReferences(
        one_rank, lambda model_dir, count: hf_greedy(model_dir, PROMPTS[:count],
                                                     MAX_TOKENS[:count]))
