"""The steps the executor owes results for, and the rule for sending one more.

At most one plan is in flight, or two with async scheduling: the plan of step N+1 is sent
while step N runs (the executor feeds its own samples in), hiding the hop. Results come
back in order; a failure makes every step sent so far stale, so a late error or result for
one of them is recognized and dropped."""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable

from folio.shared.protocol.step import StepPlan


def awaits_result(plan: StepPlan) -> bool:
    """Whether the executor answers this plan with a result: only a plan that computes
    tokens is (a plan of forget notices alone is not: executor/service.py answers non-empty
    plans only)."""
    return not plan.is_empty


class StepsInFlight:
    def __init__(self, one_ahead: bool, clock: Callable[[], float] = time.monotonic) -> None:
        self.one_ahead = one_ahead
        self.clock = clock
        self.plans: deque[StepPlan] = deque()   # results due, oldest first
        self.running_since = 0.0   # when the oldest became the step the executor is on
        self.ahead_tried = False   # a plan ahead found nothing to do: wait for a result
        self.last_sent = -1
        self.stale_through = -1    # errors for steps up to this one were already handled

    def can_send(self, has_work: bool) -> bool:
        """Whether to plan a step now, given the scheduler has work."""
        if not has_work:
            return False
        if not self.plans:
            return True
        return self.one_ahead and len(self.plans) == 1 and not self.ahead_tried

    def step_running_since(self) -> float | None:
        """When the step the executor is on began; None: it owes nothing."""
        return self.running_since if self.plans else None

    def planned(self, plan: StepPlan | None, ahead: bool) -> None:
        """A step was planned while `ahead` (a result was still due) and sent, unless
        `plan` is None (nothing for the executor)."""
        if plan is not None:
            self.last_sent = plan.step_id
        if plan is None or not awaits_result(plan):
            self.ahead_tried = ahead
            return
        if not self.plans:
            self.running_since = self.clock()
        self.plans.append(plan)

    def take(self, step_id: int) -> StepPlan | None:
        """The plan a result answers: the oldest in flight; None if that result is not
        the one due (late, or for a step given up on)."""
        if not self.plans or self.plans[0].step_id != step_id:
            return None
        self.ahead_tried = False
        self.running_since = self.clock()
        return self.plans.popleft()

    def new_work(self) -> None:
        """A request arrived: a plan ahead may find something to do again."""
        self.ahead_tried = False

    def is_stale(self, step_id: int) -> bool:
        return step_id <= self.stale_through

    def give_up(self) -> None:
        """Every step sent so far failed: no result is awaited, their errors are stale."""
        self.plans.clear()
        self.stale_through = self.last_sent

    def restart(self) -> None:
        """A new executor with a new Scheduler, whose steps count from 0."""
        self.last_sent = self.stale_through = -1
