"""The reliability cluster's fixtures (tests/processes/cluster.py): one cluster for the whole
package's reliability files, healed before each test that asks for `healthy`."""

from __future__ import annotations

import pytest

from tests.processes.cluster import running_cluster


@pytest.fixture(scope="package")
def cluster(tmp_path_factory, llama_dir):
    yield from running_cluster(tmp_path_factory, llama_dir)


@pytest.fixture
def long_cluster(tmp_path_factory, long_llama_dir):
    """The same processes on a 32768-token model with room for three ENDLESS answers, for a
    test whose requests must run on for as long as the test takes to look (its own: the
    test stops one of them)."""
    yield from running_cluster(tmp_path_factory, long_llama_dir, 4096)


@pytest.fixture
def healthy(cluster):
    cluster.heal()
    return cluster
