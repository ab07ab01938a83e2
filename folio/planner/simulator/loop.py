"""The one loop that drives the real Scheduler over a trace on simulated time, for
`folio simulate` (folio/planner/simulator/run.py) and `folio plan` (folio/planner/replay.py).

Nothing is computed: SpeedExecutor samples a token wherever the real executor would, and
the caller's `step_seconds(plan, contexts)` says how long each step takes. Each step is
yielded after the scheduler has applied its result.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Iterator
from dataclasses import dataclass

from folio.planner.simulator.inputs import TraceRequest
from folio.scheduler.scheduler import Scheduler
from folio.shared.config import SchedulerConfig
from folio.shared.outputs import EngineOutput
from folio.shared.sampling_params import SamplingParams
from folio.shared.protocol.step import StepPlan, StepResult

VOCAB = 32000


class SpeedExecutor:
    """Computes nothing: samples a token for every request that reaches the end of its
    known tokens, as the real executor does."""

    def __init__(self) -> None:
        self.held: dict[int, list[int]] = {}   # handle -> [known tokens, computed tokens]

    def execute(self, plan: StepPlan) -> StepResult:
        for handle in plan.dropped_handles:
            self.held.pop(handle, None)
        scheduled = []
        for new in plan.new_requests:
            self.held[new.handle] = [len(new.token_ids), new.num_computed_tokens]
            scheduled.append((new.handle, new.num_new_tokens))
        scheduled += zip(plan.running_handles, plan.running_num_tokens)
        result = StepResult(plan.step_id)
        for handle, count in scheduled:
            state = self.held[handle]
            state[1] += count
            if state[1] == state[0]:
                state[0] += 1
                result.handles.append(handle)
                result.token_ids.append((handle * 7919 + state[0]) % VOCAB)
        return result


def prompt_ids(index: int, request: TraceRequest) -> list[int]:
    """A shared prefix is the same ids for the same prefix id; the rest is this request's."""
    ids: list[int] = []
    if request.prefix is not None:
        shared = min(request.prompt_tokens, request.prefix_tokens or request.prompt_tokens)
        ids = random.Random(f"prefix:{request.prefix}").choices(range(VOCAB), k=shared)
    own = random.Random(f"request:{index}")
    return ids + own.choices(range(VOCAB), k=request.prompt_tokens - len(ids))


@dataclass
class Step:
    number: int                 # from 1
    plan: StepPlan
    stats: dict                 # the scheduler's stats once the step was planned
    start: float                # simulated seconds
    end: float
    outputs: list[EngineOutput]
    admitted: list[int]         # trace indices the plan (re)admits


# (plan, [(tokens computed, context after them) per scheduled request]) -> seconds
StepSeconds = Callable[[StepPlan, list[tuple[int, int]]], float]


def replay(trace: list[TraceRequest], config: SchedulerConfig, step_seconds: StepSeconds,
           scheduler: Scheduler | None = None, static_batch: int | None = None,
           one_ahead: bool = False) -> Iterator[Step]:
    """Feed `trace` to the scheduler as the simulated clock reaches each arrival, and step
    until all have finished. static_batch: release that many arrived requests only when the
    previous batch has finished (request-level batching). one_ahead: the scheduler process's
    async scheduling, each step planned when the one before it starts, so a step admits only
    the requests that had arrived by then."""
    scheduler = scheduler or Scheduler(config)
    executor = SpeedExecutor()
    order = sorted(range(len(trace)), key=lambda i: trace[i].arrival)
    names = [trace[i].name or str(i) for i in range(len(trace))]
    by_handle: dict[int, int] = {}
    live = {}   # handle -> the scheduler's request, for its context length
    arrived, clock, number, planned_at = 0, 0.0, 0, 0.0
    while arrived < len(order) or scheduler.has_unfinished_requests():
        idle = not scheduler.has_unfinished_requests()
        if idle and trace[order[arrived]].arrival > clock:
            clock = trace[order[arrived]].arrival   # nothing to do until the next one
        limit = len(order)
        if static_batch is not None:
            limit = arrived + static_batch if idle else arrived
        gate = planned_at if one_ahead and not idle else clock
        while arrived < min(limit, len(order)) and trace[order[arrived]].arrival <= gate:
            index = order[arrived]
            request = trace[index]
            scheduler.add_request(names[index], prompt_ids(index, request), SamplingParams(
                max_tokens=request.output_tokens, ignore_eos=True))
            held = scheduler.requests[names[index]]
            by_handle[held.handle] = index
            live[held.handle] = held
            arrived += 1
        plan = scheduler.schedule()
        if plan.is_empty:
            raise ValueError(f"a waiting request can never be admitted "
                             f"({config.num_kv_blocks} blocks of {config.block_size})")
        number += 1
        stats = scheduler.stats()
        # The scheduler has advanced each scheduled request's computed count to the step's end.
        rows = [(new.num_new_tokens, new.num_computed_tokens + new.num_new_tokens)
                for new in plan.new_requests]
        rows += [(count, live[handle].num_computed_tokens)
                 for handle, count in zip(plan.running_handles, plan.running_num_tokens)]
        start = planned_at = clock
        clock += step_seconds(plan, rows)
        outputs = list(scheduler.update(plan, executor.execute(plan)))
        yield Step(number, plan, stats, start, clock, outputs,
                   [by_handle[new.handle] for new in plan.new_requests])
