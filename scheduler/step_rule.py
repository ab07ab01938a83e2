"""Left only for folio/engine.py, until it calls `Scheduler.plan_for_executor()` itself;
then delete this file. What one step is lives on the Scheduler (plan_for_executor) and, for
which plans are answered, in steps_in_flight.py (awaits_result)."""

from __future__ import annotations

from folio.scheduler.scheduler import Scheduler
from folio.shared.step import StepPlan


def plan_for_executor(scheduler: Scheduler) -> StepPlan | None:
    return scheduler.plan_for_executor()
