"""The planner tests' shared fixture."""

from __future__ import annotations

import pytest

from folio.planner.cost import CostModel
from tests.planner.hand_cost import hand_cost


@pytest.fixture
def cost() -> CostModel:
    return hand_cost()
