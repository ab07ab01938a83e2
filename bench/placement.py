"""CPU placement of `folio serve`'s processes, raced under the serving benchmark.

    python bench/placement.py --model DIR --rounds 2 -o placement.json
    python bench/placement.py --variant split=--cpu-placement=split \
        --variant shared=--cpu-placement=shared --variant 'passive=--cpu-placement=shared;OMP_WAIT_POLICY=PASSIVE'

Each variant is `NAME=FLAG[,FLAG...][;ENV=VALUE...]`: `folio serve` flags and environment
for the server's processes. Give each variant its --cpu-placement: without one, the run
is bench/data_parallel.py's one-replica baseline, `split`. Variants run one after another in each round (A B A B), on the
same workload as bench/serve.py (random token-id prompts, `ignore_eos`, greedy, streamed),
with the client on the same machine. Reports output tok/s, TPOT and TTFT p50, the cores
the executor got and the CPU seconds of the frontend and scheduler, with the load average
before each run.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench.data_parallel import children_cpu_s, start, stop  # noqa: E402
from bench.serve import add_workload_args, build_workload, run_benchmark  # noqa: E402

DEFAULT_VARIANTS = ("split=--cpu-placement=split", "auto=--cpu-placement=auto")


def parse_variant(text: str) -> tuple[str, list[str], dict[str, str]]:
    name, _, rest = text.partition("=")
    flags_text, _, env_text = rest.partition(";")
    flags = [f for f in flags_text.split(",") if f]
    env = dict(item.split("=", 1) for item in env_text.split(";") if item)
    if not name:
        raise SystemExit(f"variant {text!r}: NAME=FLAG[,FLAG...][;ENV=VALUE...]")
    return name, flags, env


def one_run(name: str, flags: list[str], env: dict[str, str], args, seed: int) -> dict:
    proc, base = start(1, args.model, flags, env)
    try:
        prompts = build_workload(args, seed=seed)
        names = ("folio-executor", "folio-frontend", "folio-scheduler")
        before = {n: children_cpu_s(proc.pid, n) for n in names}
        report = asyncio.run(run_benchmark(
            base, prompts, args.output_len, model=None, max_concurrency=args.max_concurrency,
            request_rate=float("inf"), seed=seed, request_timeout=args.request_timeout,
            deadline=args.deadline))
        cpu = {n: children_cpu_s(proc.pid, n) - before[n] for n in names}
        return {"variant": name, "flags": flags, "env": env, **report,
                "executor_cores_used": cpu["folio-executor"] / report["duration_s"],
                "frontend_cpu_s": cpu["folio-frontend"],
                "scheduler_cpu_s": cpu["folio-scheduler"]}
    finally:
        stop(proc)


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default=None, help="checkpoint (default: the built-in)")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--max-concurrency", type=int, default=64)
    parser.add_argument("--variant", action="append", default=None,
                        help="NAME=FLAG[,FLAG...][;ENV=VALUE...] (repeatable)")
    parser.add_argument("-o", "--out", type=Path, default=None)
    add_workload_args(parser)
    args = parser.parse_args(argv)
    if args.model_dir is None and args.vocab_size is None:
        from folio.cli import resolve_model

        args.model_dir = Path(resolve_model(args.model))
    variants = [parse_variant(v) for v in (args.variant or DEFAULT_VARIANTS)]
    runs = []
    for round_ in range(args.rounds):
        for name, flags, env in variants:
            report = one_run(name, flags, env, args, seed=args.seed + round_)
            runs.append(report)
            print(f"round {round_} {name}: {report['output_throughput']:.1f} out tok/s, "
                  f"TPOT p50 {report['tpot_ms']['p50']:.1f} ms, "
                  f"TTFT p50 {report['ttft_ms']['p50']:.0f} ms, executor on "
                  f"{report['executor_cores_used']:.2f} cores, frontend "
                  f"{report['frontend_cpu_s']:.1f} CPU s, scheduler "
                  f"{report['scheduler_cpu_s']:.1f} CPU s (load "
                  f"{report['loadavg_1m_before']:.2f} before)", flush=True)
    medians = {name: statistics.median(r["output_throughput"] for r in runs
                                       if r["variant"] == name) for name, _, _ in variants}
    print("median out tok/s: " + ", ".join(f"{n} {v:.1f}" for n, v in medians.items()))
    if args.out:
        args.out.write_text(json.dumps({"runs": runs, "median_output_throughput": medians},
                                       indent=2))


if __name__ == "__main__":
    main()
