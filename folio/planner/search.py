"""`folio plan`'s questions: the highest request rate that meets a latency SLO (bisection
over replays), the options `--compare` sets side by side, and latency against load.

An SLO is met at a rate when every named metric's percentile (one percentile for all,
--slo-percentile) is at or under its bound over the whole replayed workload.
"""

from __future__ import annotations

from dataclasses import dataclass

from folio.planner.cost import CostModel
from folio.planner.replay import Options, PlanResult, predict
from folio.planner.workload import Workload

SLO_METRICS = ("ttft", "tpot", "itl")
LOAD_POINTS = (0.25, 0.5, 0.75, 1.0, 1.25, 1.5, 2.0)   # of the workload's rate


def parse_slo(text: str) -> dict[str, float]:
    """'tpot=50ms,ttft=1s' -> {metric: bound in ms}; a bare number is ms."""
    bounds: dict[str, float] = {}
    for item in filter(None, text.split(",")):
        metric, equals, value = item.partition("=")
        if not equals or metric not in SLO_METRICS:
            raise ValueError(f"{text!r}: {metric!r} is not one of "
                             f"{', '.join(SLO_METRICS)} (e.g. tpot=50ms,ttft=1s)")
        scale = 1.0
        if value.endswith("ms"):
            value = value[:-2]
        elif value.endswith("s"):
            value, scale = value[:-1], 1000.0
        try:
            bound = float(value) * scale
        except ValueError:
            raise ValueError(f"{text!r}: {item!r} is not a time (50ms, 1s)") from None
        if not bound > 0:
            raise ValueError(f"{text!r}: {metric} must be > 0")
        bounds[metric] = bound
    if not bounds:
        raise ValueError(f"{text!r}: name a bound, e.g. tpot=50ms,ttft=1s")
    return bounds


def meets(summary: dict, slo: dict[str, float], quantile: int) -> bool:
    return all(summary[f"{metric}_p{quantile}_ms"] <= bound for metric, bound in slo.items())


@dataclass
class Capacity:
    rate: float | None            # the highest rate found to meet the SLO; None: none does
    result: PlanResult | None     # the replay at that rate
    tried: list[PlanResult]
    bounded: bool = True          # False: met at every rate tried (the workload's n
                                  # requests never load the engine enough to miss it)


def search_rate(workload: Workload, cost: CostModel, options: Options, slo: dict[str, float],
                quantile: int, rounds: int = 8) -> Capacity:
    """Bracket the highest passing rate by doubling or halving from the workload's own
    rate, then bisect `rounds` times (to within 2^-rounds of the bracket)."""
    tried: list[PlanResult] = []

    def run(rate: float) -> PlanResult:
        result = predict(workload.at_rate(rate).trace(), cost, options, rate)
        tried.append(result)
        return result

    rate = workload.rate
    first = run(rate)
    good: PlanResult | None = first if meets(first.summary, slo, quantile) else None
    low, high = (rate, None) if good else (None, rate)
    for _ in range(12):
        if low is not None and high is not None:
            break
        probe = low * 2 if high is None else high / 2
        result = run(probe)
        if meets(result.summary, slo, quantile):
            low, good = probe, result
        else:
            high = probe
    if low is None:
        return Capacity(None, None, tried)
    if high is None:   # passes at every rate tried: the workload never loads it
        return Capacity(low, good, tried, bounded=False)
    for _ in range(rounds):
        middle = (low + high) / 2
        result = run(middle)
        if meets(result.summary, slo, quantile):
            low, good = middle, result
        else:
            high = middle
    return Capacity(low, good, tried)


def compare_options(cost: CostModel) -> list[Options]:
    """The calibrated engine, then one change at a time: the KV types of other sizes, half
    and double the block size and the batched-token budget, prefix caching flipped, and
    contiguous reservation of max_model_len."""
    kv, policy = cost.kv, cost.scheduling
    options = [Options()]
    sizes = {kv.bytes_per_token.get(kv.kv_cache_dtype)}
    for dtype, size in kv.bytes_per_token.items():
        if size not in sizes:
            sizes.add(size)
            options.append(Options(f"kv {dtype}", kv_dtype=dtype))
    for block_size in (kv.block_size // 2, kv.block_size * 2):
        if block_size >= 1:
            options.append(Options(f"block size {block_size}", block_size=block_size))
    budget = policy["max_num_batched_tokens"]
    for tokens in (max(budget // 2, 1), budget * 2):
        options.append(Options(f"max batched tokens {tokens}",
                               max_num_batched_tokens=tokens))
    caching = policy["enable_prefix_caching"]
    options.append(Options(f"prefix caching {'off' if caching else 'on'}",
                           prefix_caching=not caching))
    options.append(Options(f"contiguous, reserve {kv.max_model_len}", contiguous=True))
    return options


def load_curve(workload: Workload, cost: CostModel, options: Options,
               points: tuple[float, ...] = LOAD_POINTS) -> list[PlanResult]:
    """The plan at fractions of the workload's rate (latency against load)."""
    return [predict(workload.at_rate(workload.rate * p).trace(), cost, options,
                    workload.rate * p) for p in points]
