"""`folio plan`'s prediction: a workload replayed through the serving Scheduler (the class
the engine and the scheduler process run) by folio/planner/simulator/loop.py's loop, each step costed by
the calibrated model (folio/planner/cost.py) on a simulated clock.

Latencies as vLLM's benchmark reports them: TTFT from arrival to the first token, TPOT a
request's (last token - first token) / (output tokens - 1), ITL every gap between two
tokens of a request. Percentiles are over requests (TTFT, TPOT) or gaps (ITL), interpolated
between the two nearest ranks as vLLM's benchmark computes them.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace
from typing import Any

from folio.planner.cost import CostModel
from folio.planner.simulator.contiguous import reserved
from folio.planner.simulator.inputs import MAX_KV_BLOCKS, Machine, TraceRequest
from folio.planner.simulator.loop import VOCAB, replay
from folio.scheduler.scheduler import Scheduler
from folio.shared.config import SchedulerConfig, SettingError
from folio.planner.simulator.run import percentile

QUANTILES = (50, 90, 99)


@dataclass(frozen=True)
class Options:
    """One engine configuration to plan for; None: the calibrated value."""

    name: str = "calibrated"
    block_size: int | None = None
    kv_dtype: str | None = None
    max_num_batched_tokens: int | None = None
    max_num_seqs: int | None = None
    prefix_caching: bool | None = None
    preemption_mode: str | None = None
    num_kv_blocks: int | None = None
    contiguous: bool = False   # reserve max_model_len slots per request, in one piece
    one_ahead: bool = True     # async scheduling, `folio serve`'s default


def scheduler_config(cost: CostModel, options: Options) -> SchedulerConfig:
    kv, policy = cost.kv, cost.scheduling
    block_size = options.block_size or kv.block_size
    dtype = options.kv_dtype or kv.kv_cache_dtype
    if options.num_kv_blocks:
        blocks = options.num_kv_blocks
    elif dtype in kv.bytes_per_token:
        blocks = kv.blocks(block_size, dtype)
    else:   # the calibrated type: the calibrated pool, in blocks of the asked size
        blocks = kv.num_kv_blocks * kv.block_size // block_size
    machine = Machine(blocks, block_size, kv.max_model_len,
                      options.max_num_seqs or policy["max_num_seqs"],
                      options.max_num_batched_tokens or policy["max_num_batched_tokens"],
                      enable_prefix_caching=policy["enable_prefix_caching"]
                      if options.prefix_caching is None else options.prefix_caching,
                      preemption_mode=options.preemption_mode or policy["preemption_mode"])
    _check_pool(blocks, block_size, options)
    if options.contiguous:
        machine = reserved(machine, kv.max_model_len)
        if machine is None:
            raise ValueError("not one max_model_len reservation fits the KV memory")
    swap_blocks = kv.num_swap_blocks * kv.block_size // machine.block_size
    return SchedulerConfig(
        num_kv_blocks=machine.num_kv_blocks, block_size=machine.block_size,
        max_model_len=machine.max_model_len, max_num_seqs=machine.max_num_seqs,
        max_num_batched_tokens=max(machine.max_num_batched_tokens, machine.block_size)
        if options.contiguous else machine.max_num_batched_tokens,
        enable_chunked_prefill=policy.get("enable_chunked_prefill", True),
        enable_prefix_caching=machine.enable_prefix_caching,
        preemption_mode=machine.preemption_mode, vocab_size=VOCAB,
        num_swap_blocks=swap_blocks if machine.preemption_mode != "recompute" else 0)


def _check_pool(blocks: int, block_size: int, options: Options) -> None:
    """A pool the Scheduler can hold: each simulated block is an object in memory, and the
    calibrated memory cut into small blocks of a small type can make millions."""
    source = "num_kv_blocks" if options.num_kv_blocks else "cost"
    pool = f"{blocks:,} KV blocks" if options.num_kv_blocks else \
        f"kv.memory_bytes in blocks of {block_size} tokens makes {blocks:,} KV blocks"
    if blocks < 1:
        raise SettingError(source, f"(plan {options.name!r}) {pool}: none fits")
    if blocks > MAX_KV_BLOCKS:
        raise SettingError(source, f"(plan {options.name!r}) {pool}, more than a plan "
                           f"simulates ({MAX_KV_BLOCKS:,}; give --num-kv-blocks or a larger "
                           "--block-size)")


@dataclass(frozen=True)
class RequestTimes:
    """One request of a replay, in trace order."""

    ttft_ms: float
    tpot_ms: float | None   # None: a single output token
    rows: float             # requests per step, averaged over its steps after the first token


@dataclass
class PlanResult:
    name: str
    rate: float
    summary: dict[str, Any]
    scheduler: Scheduler = field(repr=False)   # the instance that ran it
    requests: list[RequestTimes] = field(default_factory=list, repr=False)


def _reaching(trace: list[TraceRequest], served) -> list[TraceRequest]:
    """When each request reaches the scheduler, served: request_ms after it arrives (read,
    checked, tokenized). Requests that arrive together reach it together: measured, a clump
    sent within a few ms reached the scheduler within a few ms and shared a prompt step."""
    return [replace(request, arrival=request.arrival + served.request_ms / 1000)
            for request in trace]


def between_clusters(values: list[float]) -> tuple[float, float] | None:
    """(the value two ranks below the median, two ranks above) when they are more than half
    the median apart: the median sits between two clusters (requests that decode beside
    another's long prompt step and those that do not, say), and one request changing sides
    moves it by that much. None when it does not, or with fewer than 8 values."""
    if len(values) < 8:
        return None
    ordered = sorted(values)
    position = (len(ordered) - 1) / 2
    below = ordered[max(0, math.floor(position) - 1)]
    above = ordered[min(len(ordered) - 1, math.ceil(position) + 1)]
    return (below, above) if above - below > 0.5 * percentile(ordered, 50) else None


def predict(trace: list[TraceRequest], cost: CostModel, options: Options = Options(),
            rate: float = 0.0) -> PlanResult:
    config = scheduler_config(cost, options)
    scheduler = Scheduler(config)
    longest = max(r.length for r in trace)
    if longest > config.max_model_len:
        raise ValueError(f"a request of {longest} tokens (prompt plus output) is longer than "
                         f"max_model_len = {config.max_model_len}")
    names = [r.name or str(i) for i, r in enumerate(trace)]
    arrival = {name: r.arrival for name, r in zip(names, trace)}
    times: dict[str, list[float]] = {name: [] for name in names}
    rows_at: dict[str, list[int]] = {name: [] for name in names}   # the step's rows, per token
    swapped = peak_blocks = peak_running = 0
    running_time = 0.0

    def step_seconds(plan, rows) -> float:
        return cost.step_ms(rows, len(plan.swap_out) + len(plan.swap_in),
                            options.one_ahead) / 1000

    # Served, a request reaches the scheduler request_ms after it arrives (TTFT still
    # counts from its arrival).
    reaching = _reaching(trace, cost.served) if cost.served is not None else trace
    end = 0.0
    for step in replay(reaching, config, step_seconds, scheduler,
                       one_ahead=options.one_ahead):
        swapped += len(step.plan.swap_out) + len(step.plan.swap_in)
        peak_blocks = max(peak_blocks, step.stats["kv_blocks_used"])
        peak_running = max(peak_running, step.stats["num_running"])
        running_time += step.stats["num_running"] * (step.end - step.start)
        step_rows = len(step.plan.new_requests) + len(step.plan.running_handles)
        for output in step.outputs:
            times[output.request_id] += [step.end] * len(output.new_token_ids)
            rows_at[output.request_id] += [step_rows] * len(output.new_token_ids)
        end = step.end
    final = scheduler.stats()
    requests = [RequestTimes(
        (times[n][0] - arrival[n]) * 1000,
        (times[n][-1] - times[n][0]) / (len(times[n]) - 1) * 1000 if len(times[n]) > 1
        else None,
        sum(rows_at[n][1:]) / (len(rows_at[n]) - 1) if len(rows_at[n]) > 1 else 1.0)
        for n in names]
    ttft = [r.ttft_ms / 1000 for r in requests]
    tpot = [r.tpot_ms / 1000 for r in requests if r.tpot_ms is not None]
    itl = [b - a for n in names for a, b in zip(times[n], times[n][1:])]
    start = min(arrival.values())
    span = max(end - start, 1e-9)
    tokens = sum(len(t) for t in times.values())
    summary = {
        "option": options.name, "rate": round(rate, 4), "requests": len(trace),
        "duration_s": round(span, 4), "request_throughput": round(len(trace) / span, 4),
        "output_throughput": round(tokens / span, 2),
        **{f"{metric}_p{q}_ms": round(percentile(values, q) * 1000, 3)
           for metric, values in (("ttft", ttft), ("tpot", tpot), ("itl", itl))
           for q in QUANTILES},
        "kv_blocks": config.num_kv_blocks, "block_size": config.block_size,
        "peak_kv_blocks": peak_blocks, "peak_running": peak_running,
        "mean_running": round(running_time / span, 3),
        "preemptions": final["preemptions_recompute"] + final["preemptions_swap"],
        "swap_blocks": swapped,
        "prefix_hit_rate": round(final["prefix_cache_hits"] / final["prefix_cache_queries"], 4)
        if final["prefix_cache_queries"] else 0.0,
        # A p50 between two clusters of requests, in ms: (two ranks below it, two above).
        "p50_between_clusters": {metric: [round(v * 1000, 3) for v in span]
                                 for metric, span in (("ttft", between_clusters(ttft)),
                                                      ("tpot", between_clusters(tpot)))
                                 if span is not None}}
    return PlanResult(options.name, rate, summary, scheduler, requests)
