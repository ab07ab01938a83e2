"""`folio simulate`: replay a request trace through the real Scheduler on a fake executor
of a given speed and memory, and compare paging with contiguous reservation.

The trace and the machine are folio/sim_inputs.py's. Time is simulated: a step takes
ms_per_step plus its tokens at tokens_per_s.
"""

from __future__ import annotations

import math
import random
from dataclasses import dataclass, field
from typing import Any

from folio.sim_contiguous import baselines
from folio.sim_inputs import Machine, TraceRequest
from folio.scheduler.scheduler import Scheduler
from folio.shared.config import SchedulerConfig
from folio.shared.sampling_params import SamplingParams
from folio.shared.step import StepPlan, StepResult

VOCAB = 32000


@dataclass
class Run:
    name: str
    machine: Machine
    steps: int = 0
    clock: float = 0.0
    preemptions: int = 0
    peak_running: int = 0
    peak_blocks: int = 0
    queue_delays: list[float] = field(default_factory=list)
    admitted_step: dict[str, int] = field(default_factory=dict)   # first admission, from 1
    finished_step: dict[str, int] = field(default_factory=dict)
    # (time at the step's end, blocks in use, requests running, slot utilization)
    timeline: list[tuple[float, int, int, float]] = field(default_factory=list)

    def summary(self) -> dict[str, Any]:
        spans = [b[0] - a[0] for a, b in zip([(0.0,)] + self.timeline, self.timeline)]
        utilization = (sum(s * t[3] for s, t in zip(spans, self.timeline)) / sum(spans)
                       if self.timeline and sum(spans) else 1.0)
        return {"policy": self.name, "peak_running": self.peak_running,
                "peak_blocks": self.peak_blocks, "blocks": self.machine.num_kv_blocks,
                "slot_utilization": round(utilization, 4), "preemptions": self.preemptions,
                "rounds": self.steps, "drain_s": round(self.clock, 6),
                **{f"queue_p{q}_s": round(percentile(self.queue_delays, q), 6)
                   for q in (50, 90, 99)}}


def percentile(values: list[float], q: float) -> float:
    """Nearest-rank percentile (0 for no values)."""
    if not values:
        return 0.0
    ordered = sorted(values)
    return ordered[max(0, math.ceil(q / 100 * len(ordered)) - 1)]


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


def simulate(trace: list[TraceRequest], machine: Machine, name: str = "paged",
             static_batches: bool = False) -> Run:
    """Replay `trace`. static_batches: release a batch of max_num_seqs arrived requests
    only when the previous batch has finished (request-level batching)."""
    config = SchedulerConfig(
        num_kv_blocks=machine.num_kv_blocks, block_size=machine.block_size,
        max_num_seqs=machine.max_num_seqs,
        max_num_batched_tokens=machine.max_num_batched_tokens,
        max_model_len=machine.max_model_len, vocab_size=VOCAB,
        enable_prefix_caching=machine.enable_prefix_caching,
        preemption_mode=machine.preemption_mode)
    scheduler, executor, run = Scheduler(config), SpeedExecutor(), Run(name, machine)
    order = sorted(range(len(trace)), key=lambda i: trace[i].arrival)
    names = [trace[i].name or str(i) for i in range(len(trace))]
    by_handle: dict[int, int] = {}
    arrived = 0
    while arrived < len(order) or scheduler.has_unfinished_requests():
        idle = not scheduler.has_unfinished_requests()
        if idle and trace[order[arrived]].arrival > run.clock:
            run.clock = trace[order[arrived]].arrival   # nothing to do until the next one
        limit = len(order)
        if static_batches:
            limit = arrived + machine.max_num_seqs if idle else arrived
        while arrived < min(limit, len(order)) and trace[order[arrived]].arrival <= run.clock:
            index = order[arrived]
            request = trace[index]
            scheduler.add_request(names[index], prompt_ids(index, request), SamplingParams(
                max_tokens=request.output_tokens, ignore_eos=True))
            by_handle[scheduler.requests[names[index]].handle] = index
            arrived += 1
        plan = scheduler.schedule()
        if plan.is_empty:
            raise ValueError(f"{name}: a waiting request can never be admitted "
                             f"({machine.num_kv_blocks} blocks of {machine.block_size})")
        run.steps += 1
        for new in plan.new_requests:
            index = by_handle[new.handle]
            if names[index] not in run.admitted_step:
                run.admitted_step[names[index]] = run.steps
                run.queue_delays.append(run.clock - trace[index].arrival)
        stats = scheduler.stats()
        run.peak_running = max(run.peak_running, stats["num_running"])
        run.peak_blocks = max(run.peak_blocks, stats["kv_blocks_used"])
        tokens = plan.num_scheduled_tokens
        run.clock += machine.ms_per_step / 1000 + (
            tokens / machine.tokens_per_s if machine.tokens_per_s else 0.0)
        for output in scheduler.update(plan, executor.execute(plan)):
            if output.finished:
                run.finished_step[output.request_id] = run.steps
        run.timeline.append((run.clock, stats["kv_blocks_used"], stats["num_running"],
                             stats["kv_slot_utilization"]))
    final = scheduler.stats()
    run.preemptions = final["preemptions_recompute"] + final["preemptions_swap"]
    return run


def compare(trace: list[TraceRequest], machine: Machine) -> list[Run]:
    """The paged policy, then contiguous reservation of max_model_len and of the true max."""
    longest = max(r.length for r in trace)
    if longest > machine.max_model_len:
        raise ValueError(f"a request of {longest} tokens (prompt plus output) is longer than "
                         f"max_model_len = {machine.max_model_len}")
    runs = [simulate(trace, machine, "paged")]
    for name, reserved in baselines(machine, trace):
        if reserved is not None:
            runs.append(simulate(trace, reserved, name))
    return runs
