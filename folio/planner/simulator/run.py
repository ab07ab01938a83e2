"""`folio simulate`: replay a request trace through the real Scheduler on a fake executor
of a given speed and memory, and compare paging with contiguous reservation.

The trace and the machine are folio/planner/simulator/inputs.py's; the loop that drives the scheduler is
folio/planner/simulator/loop.py's. Time is simulated: a step takes ms_per_step plus its tokens at
tokens_per_s.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

from folio.planner.simulator.contiguous import baselines
from folio.planner.simulator.inputs import Machine, TraceRequest
from folio.planner.simulator.loop import VOCAB, replay
from folio.scheduler.scheduler import Scheduler
from folio.shared.config import SchedulerConfig


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
    """The q-th percentile interpolated between the two nearest ranks, as numpy's default
    and vLLM's `bench serve` compute it, so that a plan reads like the benchmark it is
    checked against (0 for no values). Nearest-rank differs where it matters most: with
    latencies in two clusters split near the middle (requests that decode beside another's
    long prompt step and those that do not), the p50 of 24 requests is the mean of the 12th
    and 13th, between the clusters, while nearest-rank picks one of them."""
    if not values:
        return 0.0
    ordered = sorted(values)
    position = q / 100 * (len(ordered) - 1)
    low = math.floor(position)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (position - low)


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
        preemption_mode=machine.preemption_mode,
        # A hybrid's slots: one per seat, and as many again for its prefix checkpoints.
        num_state_slots=machine.state_slots * (2 if machine.enable_prefix_caching else 1))
    scheduler, run = Scheduler(config), Run(name, machine)
    per_token = 1 / machine.tokens_per_s if machine.tokens_per_s else 0.0

    def step_seconds(plan, rows) -> float:
        return machine.ms_per_step / 1000 + plan.num_scheduled_tokens * per_token

    names = [trace[i].name or str(i) for i in range(len(trace))]
    try:
        for step in replay(trace, config, step_seconds, scheduler,
                           machine.max_num_seqs if static_batches else None):
            run.steps = step.number
            for index in step.admitted:
                if names[index] not in run.admitted_step:
                    run.admitted_step[names[index]] = step.number
                    run.queue_delays.append(step.start - trace[index].arrival)
            stats = step.stats
            run.peak_running = max(run.peak_running, stats["num_running"])
            run.peak_blocks = max(run.peak_blocks, stats["kv_blocks_used"])
            run.clock = step.end
            for output in step.outputs:
                if output.finished:
                    run.finished_step[output.request_id] = step.number
            run.timeline.append((step.end, stats["kv_blocks_used"], stats["num_running"],
                                 stats["kv_slot_utilization"]))
    except ValueError as error:
        raise ValueError(f"{name}: {error}") from None
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
