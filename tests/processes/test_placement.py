"""folio serve's CPU placement: which cores the executor and the control processes get."""

from __future__ import annotations

import pytest

from folio.cli import build_parser
from folio.placement import SPLIT_MIN_CORES, plan_placement


def test_split_gives_the_control_processes_the_last_core():
    placement = plan_placement("split", [3, 0, 1, 2], executor_on_cpu=True)
    assert placement.executor_cores == (0, 1, 2) and placement.control_cores == (3,)
    assert placement.cores_for("executor") == (0, 1, 2)
    assert placement.cores_for("frontend") == placement.cores_for("scheduler") == (3,)
    assert "executor on cores 0,1,2" in placement.describe()


def test_auto_shares_few_cores_splits_many_and_pins_nothing_with_a_gpu():
    few = plan_placement("auto", [0, 1], executor_on_cpu=True)
    assert few.policy == "shared" and few.executor_cores == (0, 1) and few.control_cores is None
    many = plan_placement("auto", list(range(SPLIT_MIN_CORES)), executor_on_cpu=True)
    assert many.policy == "split" and many.control_cores == (SPLIT_MIN_CORES - 1,)
    gpu = plan_placement("auto", [0, 1], executor_on_cpu=False)
    assert gpu.policy == "off" and gpu.executor_cores is gpu.control_cores is None
    assert "no CPU pinning" in gpu.describe()


def test_one_core_cannot_be_split():
    placement = plan_placement("split", [5], executor_on_cpu=True)
    assert placement.executor_cores == (5,) and placement.control_cores is None


def test_shared_gives_the_executor_every_core():
    placement = plan_placement("shared", [0, 1], executor_on_cpu=True)
    assert placement.executor_cores == (0, 1) and placement.control_cores is None


def test_unknown_policy_is_refused_by_name():
    with pytest.raises(ValueError, match="cpu_placement must be one of"):
        plan_placement("fastest", [0, 1], executor_on_cpu=True)
    with pytest.raises(SystemExit):
        build_parser().parse_args(["serve", "--cpu-placement", "fastest"])
