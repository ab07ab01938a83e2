"""`folio plan calibrate`: measure a real executor on this machine and fit the planner's
cost model (folio/planner/cost.py).

The engine is built in-process as folio.LLM builds it (folio/engine.py). A small grid of
requests is stepped by hand, as the engine steps: the scheduler plans, the executor runs
the plan, the scheduler applies the result; the executor's part and the scheduler's part
of every step are timed apart (the scheduler's also alone, on a fake executor, at up to 256
requests a step). Prompt chunks of several sizes are run at several contexts
(a prefix already cached, then the chunk after it), and decode batches of several sizes at
several contexts, each request with a context of its own (a batch whose requests shared
one cached prefix would read it once from memory and then from the CPU's caches, which
measured a long context at a quarter of what a lone request pays). The whole grid runs
`repeats` times, and each step shape's times are reduced to their median before the fit
(a shared machine's neighbours come and go). The hop is a plan and its result through a
ZeroMQ ipc pair, encoded as on the wire.
"""

from __future__ import annotations

import os
import platform
import random
import statistics
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from datetime import datetime, timezone
from typing import Any

from folio.planner.cost import FEATURES, CostModel, KVLayout, step_features
from folio.planner.fit import fit_error, fit_non_negative
from folio.shared.sampling_params import SamplingParams


@dataclass(frozen=True)
class Grid:
    chunks: tuple[int, ...]            # prompt tokens computed in one step
    contexts: tuple[int, ...]          # ... after this many cached tokens
    batches: tuple[int, ...]           # decode rows in one step
    decode_contexts: tuple[int, ...]   # ... each this long
    decode_steps: int
    repeats: int


FULL = Grid((32, 128, 512), (0, 256, 1024), (1, 4, 16, 32), (128, 512, 1024), 6, 3)
QUICK = Grid((16, 64), (0, 64), (1, 4), (32,), 3, 1)


@dataclass
class Sample:
    rows: tuple[tuple[int, int], ...]   # (tokens computed, context after them) per request
    executor_ms: float
    scheduler_ms: float


class Stepper:
    """Steps a scheduler and an executor as the in-process engine does, timing each part
    with `clock` (seconds)."""

    def __init__(self, scheduler, executor, clock: Callable[[], float] = time.perf_counter
                 ) -> None:
        self.scheduler, self.executor, self.clock = scheduler, executor, clock
        self.live: dict[int, Any] = {}
        self.plans: list = []
        self._count = 0

    def run(self, prompts: list[list[int]], max_tokens: int) -> list[Sample]:
        scheduler, clock = self.scheduler, self.clock
        for prompt in prompts:
            request_id = f"calibrate-{self._count}"
            self._count += 1
            scheduler.add_request(request_id, prompt, SamplingParams(
                max_tokens=max_tokens, ignore_eos=True, temperature=0))
            held = scheduler.requests[request_id]
            self.live[held.handle] = held
        samples = []
        while scheduler.has_unfinished_requests():
            start = clock()
            plan = scheduler.plan_for_executor()
            planned = clock()
            if plan is None:
                continue
            rows = [(new.num_new_tokens, new.num_computed_tokens + new.num_new_tokens)
                    for new in plan.new_requests]
            rows += [(count, self.live[handle].num_computed_tokens)
                     for handle, count in zip(plan.running_handles, plan.running_num_tokens)]
            sent = clock()   # the rows' bookkeeping is neither part's cost
            result = self.executor.execute(plan)
            executed = clock()
            scheduler.update(plan, result)
            done = clock()
            self.plans.append(plan)
            samples.append(Sample(tuple(rows), (executed - sent) * 1000,
                                  (planned - start + done - executed) * 1000))
        return samples


def collect(stepper: Stepper, grid: Grid, vocab_size: int, max_model_len: int,
            pool_tokens: int, seed: int = 0) -> list[Sample]:
    """Every step of the grid, `grid.repeats` times (fresh token ids each time, so no
    prefix is shared by accident)."""
    rng = random.Random(seed)

    def ids(count: int) -> list[int]:
        return [rng.randrange(1, vocab_size) for _ in range(count)]

    samples: list[Sample] = []
    # Warm-up: the first call of each shape (allocations, kernel choices) is no step's cost.
    for chunk in grid.chunks:
        if chunk + 2 <= max_model_len:
            stepper.run([ids(chunk)], 2)
    stepper.run([ids(8) for _ in range(max(grid.batches))], 2)
    for _ in range(grid.repeats):
        for context in grid.contexts:
            chunks = [c for c in grid.chunks
                      if context + c + 1 <= max_model_len and context + c <= pool_tokens // 2]
            if not chunks:
                continue
            prefix = ids(context)
            if context:
                samples += stepper.run([prefix], 1)   # now cached: each chunk comes after it
            for chunk in chunks:
                samples += stepper.run([prefix + ids(chunk)], 1)
        for context in grid.decode_contexts:
            for batch in grid.batches:
                if context + grid.decode_steps > max_model_len or \
                        batch * (context + grid.decode_steps) > pool_tokens * 3 // 4:
                    continue
                samples += stepper.run([ids(context) for _ in range(batch)],
                                       grid.decode_steps)
    return samples


def scheduler_samples(config, batches: tuple[int, ...] = (1, 16, 64, 256),
                      steps: int = 6, seed: int = 1) -> list[Sample]:
    """The real Scheduler alone, at larger batches than the executor's grid runs, on a fake
    executor (folio/planner/simulator/loop.py's SpeedExecutor) whose results cost nothing: the scheduler's
    own time per step (plan and update) against the requests in it. `config`: the engine's
    SchedulerConfig, its pool grown to hold the largest batch."""
    from folio.scheduler.scheduler import Scheduler
    from folio.planner.simulator.loop import SpeedExecutor

    prompt = 32
    batches = tuple(b for b in batches if b <= config.max_num_seqs)
    need = max(batches) * -(-(prompt + steps + 1) // config.block_size) + 2
    config = replace(config, num_kv_blocks=max(config.num_kv_blocks, need))
    stepper = Stepper(Scheduler(config), SpeedExecutor())
    rng = random.Random(seed)
    samples = []
    for batch in batches:
        prompts = [[rng.randrange(1, config.vocab_size) for _ in range(prompt)]
                   for _ in range(batch)]
        samples += stepper.run(prompts, steps)
    return samples


def fit_samples(samples: list[Sample], control: list[Sample] = ()) -> tuple[dict, dict, dict]:
    """(executor coefficients, scheduler coefficients, fit error) from the steps, repeats
    of one step shape reduced to their medians; the scheduler's from `control` (steps on a
    fake executor, scheduler_samples) too."""
    by_shape: dict[tuple, list[Sample]] = {}
    for sample in samples:
        by_shape.setdefault(sample.rows, []).append(sample)
    shapes = list(by_shape)
    features = [step_features(list(rows)) for rows in shapes]
    executor = [statistics.median(s.executor_ms for s in by_shape[r]) for r in shapes]
    coefficients = fit_non_negative(features, executor)
    rows = [[1.0, float(len(r))] for r in shapes] + [[1.0, float(len(s.rows))]
                                                      for s in control]
    scheduler = [statistics.median(s.scheduler_ms for s in by_shape[r]) for r in shapes] + [
        s.scheduler_ms for s in control]
    sched = fit_non_negative(rows, scheduler)
    return (dict(zip(FEATURES, coefficients)), {"base": sched[0], "per_row": sched[1]},
            fit_error(features, executor, coefficients))


def measure_hop(plans: list, rounds: int = 50) -> float:
    """Median ms for a plan to reach the executor and a result to come back over a ZeroMQ
    ipc pair, encoded and decoded as on the wire (in one process: a real hop also wakes
    two processes, so this is its floor)."""
    import zmq

    from folio.shared.protocol import messages as m
    from folio.shared.protocol.scheduler_executor import (decode_plan, decode_result, encode_plan,
                                                encode_result)
    from folio.shared.protocol.step import StepResult

    sample = [p for p in plans if p.running_handles] or plans
    plan = max(sample, key=lambda p: len(p.running_handles))
    result = StepResult(plan.step_id, list(plan.running_handles),
                        [1] * len(plan.running_handles))
    context = zmq.Context()
    with tempfile.TemporaryDirectory() as directory:
        address = f"ipc://{directory}/hop"
        left, right = context.socket(zmq.PAIR), context.socket(zmq.PAIR)
        try:
            left.bind(address)
            right.connect(address)
            times = []
            for _ in range(rounds):
                start = time.perf_counter()
                left.send(encode_plan(plan))
                decode_plan(m.decode(right.recv(), frozenset({"plan"}))[1])
                right.send(encode_result(result))
                decode_result(m.decode(left.recv(), frozenset({"result"}))[1])
                times.append((time.perf_counter() - start) * 1000)
        finally:
            left.close(0)
            right.close(0)
            context.term()
    return statistics.median(times)


def swap_ms_per_block(executor) -> float:
    """A block's copy to the swap pool at the executor's measured device-to-host rate."""
    from folio.executor.block_mover import measure_swap_bytes_per_s

    try:
        rate = executor.capacity.swap_bytes_per_s or measure_swap_bytes_per_s(
            executor.kv_caches[0][0])
    except (AttributeError, IndexError, TypeError, RuntimeError):
        return 0.0
    return executor.bytes_per_block / rate * 1000 if rate > 0 else 0.0


def kv_layout(executor, config) -> KVLayout:
    from folio.shared.kv_cache_dtype import element_row_bytes
    from folio.planner.simulator.command import KV_DTYPES

    model = executor.model_config
    capacity = executor.capacity
    sizes = {dtype: model.kv_block_bytes(1, lambda dim, d=dtype: element_row_bytes(d, dim))
             for dtype in KV_DTYPES}
    stored = config.kv_cache_dtype   # auto: the model's dtype
    if stored == "auto":
        stored = str(executor.dtype).removeprefix("torch.")
    return KVLayout(capacity.num_kv_blocks, capacity.block_size, capacity.max_model_len,
                    stored, capacity.num_kv_blocks * executor.bytes_per_block,
                    sizes, capacity.num_swap_blocks)


def calibrate(config, grid: Grid, flags: dict[str, Any], hop_ms: float | None = None,
              report: Callable[[str], None] = print) -> CostModel:
    """Build the engine of `config` (an EngineConfig), measure it, fit."""
    import torch

    from folio.engine import InProcessEngine
    from folio.preflight import check_engine
    from folio.shared.config import policy_values

    check_engine(config)
    engine = InProcessEngine(replace(config, skip_tokenizer_init=True))
    try:
        executor, scheduler = engine.executor, engine.scheduler
        capacity = executor.capacity
        report(f"calibrating {config.model}: {capacity.num_kv_blocks} KV blocks of "
               f"{capacity.block_size}, on {executor.device}")
        started = time.perf_counter()
        stepper = Stepper(scheduler, executor)
        samples = collect(stepper, grid, capacity.vocab_size, capacity.max_model_len,
                          scheduler.config.usable_kv_blocks * capacity.block_size)
        control = scheduler_samples(scheduler.config,
                                    (1, 16) if grid is QUICK else (1, 16, 64, 256))
        executor_ms, scheduler_ms, error = fit_samples(samples, control)
        hop = measure_hop(stepper.plans) if hop_ms is None else hop_ms
        policy = policy_values(scheduler.config)
        scheduling = {key: policy[key] for key in (
            "max_num_seqs", "max_num_batched_tokens", "enable_chunked_prefill",
            "enable_prefix_caching", "preemption_mode")}
        return CostModel(
            executor_ms=executor_ms, scheduler_ms=scheduler_ms, hop_ms=hop,
            swap_ms_per_block=swap_ms_per_block(executor), kv=kv_layout(executor, config),
            scheduling=scheduling, model=str(config.model), flags=flags,
            machine={"host": platform.node(), "cpu": platform.machine(),
                     "cores": len(os.sched_getaffinity(0)), "device": str(executor.device),
                     "torch_threads": torch.get_num_threads(),
                     "load_average": [round(x, 2) for x in os.getloadavg()],
                     "calibration_s": round(time.perf_counter() - started, 1)},
            date=datetime.now(timezone.utc).isoformat(timespec="seconds"),
            fit_error=error, vocab_size=capacity.vocab_size)
    finally:
        engine.close()
