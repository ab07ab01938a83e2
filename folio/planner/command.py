"""`folio plan`'s command line: `folio plan calibrate` writes a cost file, `folio plan`
reads one and answers for a workload: a table, a JSON result (what the /plan page draws)
and a PNG of latency against load. docs/planner.md explains each figure."""

from __future__ import annotations

import json
import math
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from folio.shared.config import DTYPES, PREEMPTION_MODES, QUANTIZATIONS
from folio.shared.kv_cache_dtype import KV_CACHE_DTYPES
from folio.shared.settings import (Checked, at_least, in_range, optional, positive_int,
                                   setting)
from folio.planner.simulator.command import KV_DTYPES
from folio.planner.simulator.inputs import MAX_KV_BLOCKS

QUANTILE_CHOICES = ("50", "90", "99")


@dataclass(frozen=True, kw_only=True)
class PlanSettings(Checked):
    """`folio plan`'s settings; its flags and FOLIO_* variables are generated from these
    fields like every command's (folio/command_settings.py lists it)."""

    action: str | None = setting(None, "calibrate: measure --model on this machine and "
                                 "write --cost; none: plan --workload with --cost",
                                 choices=("calibrate",), positional=True, nargs="?")
    cost: str = setting("plan-cost.json", "the cost-model file calibrate writes and a plan "
                        "reads")
    # calibrate: the engine measured (EngineConfig's flags of the same names)
    model: str | None = setting(None, "calibrate: checkpoint directory (default: the "
                                "built-in model)")
    dtype: str = setting("auto", "calibrate: weights' and activations' type, as "
                         "`folio serve --dtype`", choices=DTYPES)
    quantization: str = setting("none", "calibrate: as `folio serve --quantization`",
                                choices=QUANTIZATIONS)
    kv_cache_dtype: str | None = setting(None, "calibrate: as `folio serve --kv-cache-dtype`; "
                                         "plan: the stored KV type to plan for (a float or "
                                         "quantized type)",
                                         choices=tuple(dict.fromkeys(KV_CACHE_DTYPES
                                                                     + KV_DTYPES)))
    num_kv_blocks: int | None = setting(None, "KV blocks of the pool (calibrate: the engine's "
                                        "as served; plan: instead of the calibrated memory)",
                                        check=optional(in_range(1, MAX_KV_BLOCKS)))
    cpu_threads: int | None = setting(None, "calibrate: executor's torch threads",
                                      check=optional(positive_int))
    quick: bool = setting(False, "calibrate: a small grid (seconds; for tests, not sizing)")
    hop_ms: float | None = setting(None, "calibrate: the scheduler-executor hop per step "
                                   "instead of measuring it", check=optional(at_least(0, " ms")))
    served: bool = setting(True, "calibrate: then serve the model (`folio serve`, the same "
                           "flags, a free loopback port) and measure what serving adds to a "
                           "step and a request")
    # both: the scheduling policy (plan: default the calibrated engine's)
    block_size: int | None = setting(None, "tokens per KV block", check=optional(positive_int))
    max_num_batched_tokens: int | None = setting(None, "tokens computed per step",
                                                 check=optional(positive_int))
    max_num_seqs: int | None = setting(None, "requests running at once",
                                       check=optional(positive_int))
    max_model_len: int | None = setting(None, "calibrate: context limit",
                                        check=optional(positive_int))
    preemption_mode: str | None = setting(None, "plan: how requests are preempted",
                                          choices=PREEMPTION_MODES)
    async_scheduling: bool = setting(True, "plan: as `folio serve --async-scheduling`: each "
                                     "step planned while the one before runs (an arrival "
                                     "waits a step longer; the hop is hidden)")
    # plan
    workload: str | None = setting(None, "poisson:rate=R,n=N,prompt=P,output=O[,prefix=T,"
                                   "prefixes=K,seed=S], fixed:... or a JSONL trace "
                                   "(docs/planner.md)", metavar="SPEC")
    slo: str | None = setting(None, "find the highest rate meeting e.g. tpot=50ms,ttft=1s "
                              "(ttft, tpot, itl)")
    slo_percentile: str = setting("99", "the percentile an SLO bounds", choices=QUANTILE_CHOICES)
    compare: bool = setting(False, "plan each option side by side: KV types, block sizes, "
                            "batched-token budgets, prefix caching, contiguous reservation")
    plot: str | None = setting(None, "write latency against load as this PNG", metavar="PNG")
    save: str | None = setting(None, "write the plan as JSON here (the /plan page draws it)",
                               metavar="JSON")
    json: bool = setting(False, "print the plan as JSON instead of a table")


def run_plan(settings: PlanSettings) -> int:
    if settings.action == "calibrate":
        return _calibrate(settings)
    from folio.planner.cost import load_cost
    from folio.planner.search import parse_slo
    from folio.planner.workload import parse_workload
    from folio.shared.config import SettingError

    if not settings.workload:
        raise SettingError("workload", "is needed to plan (or run `folio plan calibrate`)")
    # Each input checked (and read once) before anything runs: a problem is one line naming
    # its flag.
    read = {}
    for name, check in (("cost", load_cost), ("workload", parse_workload), ("slo", parse_slo)):
        try:
            if getattr(settings, name):
                read[name] = check(getattr(settings, name))
        except ValueError as error:
            raise SettingError(name, str(error)) from None
    try:
        plan = make_plan(settings, read["cost"], read["workload"])
    except SettingError:   # the pool (--num-kv-blocks or the cost file's memory)
        raise
    except ValueError as error:   # e.g. a request longer than the calibrated context
        raise SettingError("workload", str(error)) from None
    if settings.json:
        print(json.dumps(plan, indent=2))
    else:
        print(table(plan))
    try:
        if settings.save:
            Path(settings.save).write_text(json.dumps(plan, indent=2))
            print(f"wrote {settings.save}")
        if settings.plot:
            from folio.planner.plot import plot_plan

            plot_plan(plan, Path(settings.plot))
            print(f"wrote {settings.plot}")
    except OSError as error:
        raise SettingError("save" if settings.save and not Path(settings.save).exists()
                           else "plot", f"cannot write it ({error})") from None
    return 0


def _calibrate(settings: PlanSettings) -> int:
    from folio.planner.calibrate import FULL, QUICK, calibrate
    from folio.shared.config import EngineConfig, SettingError

    flags = {name: getattr(settings, name) for name in (
        "dtype", "quantization", "kv_cache_dtype", "block_size", "max_num_batched_tokens",
        "max_num_seqs", "num_kv_blocks", "max_model_len", "cpu_threads", "preemption_mode")
        if getattr(settings, name) is not None}
    if flags.get("kv_cache_dtype") not in (None, *KV_CACHE_DTYPES):
        raise SettingError("kv_cache_dtype", f"must be one of {', '.join(KV_CACHE_DTYPES)} "
                           "to calibrate")
    if not Path(settings.cost).resolve().parent.is_dir():   # before minutes of measuring
        raise SettingError("cost", f"{settings.cost}: its directory does not exist")
    model = settings.model
    if model is None:
        from folio.default_model import default_model_path

        model = str(default_model_path())
    config = EngineConfig(model=model, **flags)   # a bad value: SettingError, exit 2
    try:
        cost = calibrate(config, QUICK if settings.quick else FULL, flags, settings.hop_ms)
    except (OSError, ValueError) as error:
        if isinstance(error, SettingError):
            raise
        raise SettingError("model", f"cannot calibrate: {error}") from None
    if settings.served:
        cost = _calibrate_served(settings, model, flags, cost)
    Path(settings.cost).write_text(cost.to_json() + "\n")
    error = cost.fit_error
    terms = ", ".join(f"{name} {value:.4g}" for name, value in cost.executor_ms.items())
    print(f"executor ms = {terms}")
    print(f"scheduler ms = {cost.scheduler_ms['base']:.4g} + {cost.scheduler_ms['per_row']:.4g}"
          f" per request; hop {cost.hop_ms:.3f} ms; swap {cost.swap_ms_per_block:.4f} ms/block")
    print(f"fit error over {error['steps']} step shapes: median {error['median_pct']}%, "
          f"p90 {error['p90_pct']}%, R^2 {error['r2']} "
          f"(in {cost.machine['calibration_s']} s)")
    if cost.served is not None:
        served = cost.served
        print(f"served: + {served.step_ms:.3g} ms + {served.per_row_ms:.3g} ms per request a "
              f"step, + {served.request_ms:.3g} ms to reach the scheduler")
        if served.trickle:
            t = served.trickle
            print(f"served one at a time ({t['requests']} at {t['rate']:g}/s): TTFT p50 "
                  f"{t['ttft_p50_ms']:.1f} ms (fitted {t['predicted_ttft_p50_ms']:.1f}), TPOT "
                  f"p50 {t['tpot_p50_ms']:.2f} ms (fitted {t['predicted_tpot_p50_ms']:.2f})")
    print(f"wrote {settings.cost}")
    return 0


def _calibrate_served(settings: PlanSettings, model: str, flags: dict[str, Any], cost):
    from folio.planner.served import FULL_ROUNDS, QUICK_ROUNDS, calibrate_served
    from folio.shared.config import SettingError

    try:
        return calibrate_served(model, flags, cost.vocab_size, cost,
                                QUICK_ROUNDS if settings.quick else FULL_ROUNDS)
    except (OSError, RuntimeError, ValueError) as error:
        raise SettingError("served", f"cannot measure the served step: {error} "
                           "(--no-served calibrates in-process only)") from None


def _options(settings: PlanSettings):
    from folio.planner.replay import Options

    return Options("as given" if any(getattr(settings, n) is not None for n in (
        "block_size", "kv_cache_dtype", "max_num_batched_tokens", "max_num_seqs",
        "preemption_mode", "num_kv_blocks")) else "calibrated",
        settings.block_size,
        None if settings.kv_cache_dtype == "auto" else settings.kv_cache_dtype,
        settings.max_num_batched_tokens,
        settings.max_num_seqs, None, settings.preemption_mode, settings.num_kv_blocks,
        one_ahead=settings.async_scheduling)


def make_plan(settings: PlanSettings, cost, workload) -> dict[str, Any]:
    """Every option's plan at the workload's rate, its latency against load, and with an
    SLO the highest rate meeting it: one JSON-ready dict."""
    from dataclasses import replace

    from folio.planner.search import compare_options, load_curve, parse_slo, search_rate
    from folio.planner.replay import predict

    slo = parse_slo(settings.slo) if settings.slo else None
    quantile = int(settings.slo_percentile)
    if workload.kind == "trace" and not math.isfinite(workload.rate):
        raise ValueError(f"{workload.spec}: every request arrives at 0: no rate to plan at")
    given = _options(settings)
    options = [given]
    if settings.compare:
        options += [replace(o, block_size=o.block_size or given.block_size,
                            kv_dtype=o.kv_dtype or given.kv_dtype,
                            max_num_batched_tokens=o.max_num_batched_tokens
                            or given.max_num_batched_tokens,
                            max_num_seqs=given.max_num_seqs,
                            preemption_mode=given.preemption_mode,
                            one_ahead=given.one_ahead)
                    for o in compare_options(cost)[1:]]
    results = []
    for option in options:
        entry: dict[str, Any] = {
            "option": option.name,
            "at_rate": predict(workload.trace(), cost, option, workload.rate).summary,
            "curve": [r.summary for r in load_curve(workload, cost, option)]}
        if slo:
            found = search_rate(workload, cost, option, slo, quantile)
            entry["max_rate"] = None if found.rate is None else round(found.rate, 4)
            entry["max_rate_bounded"] = found.bounded
            entry["at_max_rate"] = found.result.summary if found.result else None
        results.append(entry)
    return {"workload": workload.spec, "rate": workload.rate, "requests": workload.n,
            "cost_file": settings.cost, "model": cost.model, "machine": cost.machine,
            "calibrated": cost.date, "fit_error": cost.fit_error,
            "slo": slo, "slo_percentile": quantile, "options": results}


def table(plan: dict[str, Any]) -> str:
    q = plan["slo_percentile"]
    head = ["option", "tok/s", "TTFT p50/p90/p99 ms", "TPOT p50/p90/p99 ms",
            "ITL p50/p99 ms", "peak KV blocks", "running peak/mean", "preempt", "swap blk",
            "prefix hit"]
    if plan["slo"]:
        head += [f"max rate (p{q} SLO)", "concurrency"]
    rows = [head]
    for entry in plan["options"]:
        s = entry["at_rate"]
        row = [entry["option"], f"{s['output_throughput']:.0f}",
               "/".join(f"{s[f'ttft_p{x}_ms']:.0f}" for x in (50, 90, 99)),
               "/".join(f"{s[f'tpot_p{x}_ms']:.1f}" for x in (50, 90, 99)),
               f"{s['itl_p50_ms']:.1f}/{s['itl_p99_ms']:.1f}",
               f"{s['peak_kv_blocks']}/{s['kv_blocks']}",
               f"{s['peak_running']}/{s['mean_running']:.1f}", str(s["preemptions"]),
               str(s["swap_blocks"]), f"{s['prefix_hit_rate']:.0%}"]
        if plan["slo"]:
            best = entry.get("at_max_rate")
            rate = entry["max_rate"]
            row += ["none" if rate is None else f"{rate:.3g} req/s" if entry["max_rate_bounded"]
                    else f">= {rate:.3g} req/s (never missed)",
                    f"{best['mean_running']:.1f}" if best else "-"]
        rows.append(row)
    widths = [max(len(r[i]) for r in rows) for i in range(len(head))]
    lines = [f"workload {plan['workload']} ({plan['requests']} requests at "
             f"{plan['rate']:.3g} req/s), cost {plan['cost_file']}"]
    machine, fit = plan["machine"], plan["fit_error"]
    if machine.get("load_average") and fit:
        # A step's cost moves with the machine's load: say what the costs were measured under.
        lines.append(f"calibrated {plan['calibrated']} on {machine.get('device', '?')} "
                     f"({machine.get('cores', '?')} cores) at load "
                     f"{machine['load_average'][0]:g} (now {os.getloadavg()[0]:.2f}); fit "
                     f"error median {fit.get('median_pct')}%, p90 {fit.get('p90_pct')}%")
    if plan["slo"]:
        bounds = ", ".join(f"{k} <= {v:g} ms" for k, v in plan["slo"].items())
        lines.append(f"SLO: p{q} {bounds}; concurrency: mean requests running at that rate")
    lines += ["  ".join(c.ljust(w) for c, w in zip(r, widths)).rstrip() for r in rows]
    for entry in plan["options"]:
        for metric, (below, above) in entry["at_rate"].get("p50_between_clusters", {}).items():
            lines.append(f"note: {entry['option']}: the {metric.upper()} p50 sits between two "
                         f"clusters of requests ({below:.1f} and {above:.1f} ms two ranks "
                         "either side): a request changing sides moves it that far; read "
                         "p90/p99 beside it")
    return "\n".join(lines)
