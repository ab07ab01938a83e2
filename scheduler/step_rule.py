"""What one step is, for the in-process engine (folio/engine.py) and the scheduler process
(scheduler/service.py) alike: the Scheduler plans it, the executor runs it, the Scheduler
applies its result. Only a plan that computes tokens or tells the executor to forget handles
goes to the executor; only a plan that computes tokens is answered with a result (a plan of
forget notices alone is not: executor/service.py answers non-empty plans only)."""

from __future__ import annotations

from folio.scheduler.scheduler import Scheduler
from folio.shared.step import StepPlan


def plan_for_executor(scheduler: Scheduler) -> StepPlan | None:
    """Plan the next step; None when the executor has nothing to do in it (outputs already
    decided, e.g. aborts, still wait in `take_pending_outputs`)."""
    plan = scheduler.schedule()
    if plan.is_empty and not plan.dropped_handles:
        return None
    return plan


def awaits_result(plan: StepPlan) -> bool:
    """Whether the executor answers this plan with a result."""
    return not plan.is_empty
