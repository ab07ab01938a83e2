"""The scheduler's half of multi-step decoding (docs/multi_step.md).

`--num-scheduler-steps K`: while at most MAX_RUNNING requests run, each decode row gets a
cap of K - 1 more tokens in its plan (StepPlan.drafts), which the executor fills by running
that many more one-token passes (executor/multi_step/burst.py). To the scheduler they are
drafts every one of which is accepted: the same slots are reserved ahead, the same
accounting takes the extra tokens as computed, and the steps in flight stay exact. So the
scheduler, the frontend and the ZeroMQ hops wake once per K tokens of a small batch instead
of once per token; a crowd's steps are long enough that the hops cost little, and they keep
one pass per plan, so new requests join at once.
"""

from __future__ import annotations

from folio.scheduler.request import Request
from folio.scheduler.spec_decode import DraftPlanner, room

# Bursts only while this many requests run, or fewer: the hops' ~1 ms a step is a large part
# of a small batch's step and a small part of a crowd's (docs/multi_step.md).
MAX_RUNNING = 8


class BurstPlanner(DraftPlanner):
    def __init__(self, num_scheduler_steps: int, max_running: int = MAX_RUNNING) -> None:
        self.extra = num_scheduler_steps - 1
        self.max_running = max_running
        self.counters = {"multi_step_bursts": 0, "multi_step_extra_tokens": 0}

    def step_allows(self, num_running: int) -> bool:
        return num_running <= self.max_running

    def cap(self, request: Request, step: int, budget: int) -> int:
        """The extra tokens a decode row may get: within K - 1 and, as for drafts, below
        the request's length limit counting every token the steps in flight may add."""
        return max(0, min(self.extra, room(request)))

    def tokens_in_pass(self, cap: int) -> int:
        """A burst's extra tokens run in passes of their own, not in the step's budget."""
        return 0

    def _count(self, request: Request, step: int, proposed: int, accepted: int) -> None:
        self.counters["multi_step_bursts"] += 1
        self.counters["multi_step_extra_tokens"] += accepted

    def summary(self) -> None:
        """Not speculation: the page map's speculative figures stay absent."""
        return None

    def stats(self) -> dict[str, int]:
        return dict(self.counters)
