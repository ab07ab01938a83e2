"""The plan hop to other nodes (executor/parallel/links.py): CURVE with the executor keypair, so a
peer holding the deployment's executor keys joins and receives plans, and one with other
keys never joins."""

from __future__ import annotations

import pytest

from folio.executor.parallel.links import PlanReceiver, RemotePlans
from folio.shared.config import EngineConfig
from folio.shared.security import generate_keys
from tests.http_server import free_port


@pytest.fixture
def engine(llama_dir) -> EngineConfig:
    return EngineConfig(model=str(llama_dir), tensor_parallel_size=2, nnodes=2,
                        master_addr="127.0.0.1", master_port=free_port())


def _nothing_died() -> None:
    pass


def test_a_rank_with_the_executor_keys_joins_and_gets_plans(engine, tmp_path):
    keys = tmp_path / "keys"
    generate_keys(keys)
    plans = RemotePlans(engine, (1,), str(keys))
    rank = PlanReceiver(plans.address, 1, engine, str(keys))
    try:
        plans.wait_joined(60, _nothing_died)
        assert set(plans.pids) == {1}
        plans.send(b"a plan")
        assert rank.recv() == b"a plan"
        assert plans.down() is None
    finally:
        rank.close()   # first: a rank whose rank 0 goes away ends its process
        plans.close()


def test_a_rank_with_other_keys_never_joins(engine, tmp_path):
    ours, theirs = tmp_path / "ours", tmp_path / "theirs"
    generate_keys(ours)
    generate_keys(theirs)
    plans = RemotePlans(engine, (1,), str(ours))
    rank = PlanReceiver(plans.address, 1, engine, str(theirs))
    try:
        with pytest.raises(ConnectionError, match=r"ranks \[1\] joined the group but never "
                           "reached tcp://127.0.0.1"):
            plans.wait_joined(3, _nothing_died)
    finally:
        rank.close()
        plans.close()


def test_a_rank_with_other_engine_settings_is_refused_naming_them(engine, tmp_path):
    keys = tmp_path / "keys"
    generate_keys(keys)
    plans = RemotePlans(engine, (1,), str(keys))
    other = EngineConfig(**{**engine.__dict__, "block_size": 32, "node_rank": 1})
    rank = PlanReceiver(plans.address, 1, other, str(keys))
    try:
        with pytest.raises(ValueError, match="rank 1 runs other engine settings than rank 0: "
                           "block_size=32 there, 16 here$"):
            plans.wait_joined(60, _nothing_died)
    finally:
        rank.close()
        plans.close()
