"""CPU placement of `folio serve`'s processes, raced under the serving benchmark.

    python bench/placement.py --model DIR --rounds 2 -o placement.json
    python bench/placement.py --variant split=--cpu-placement=split \
        --variant shared=--cpu-placement=shared --variant 'passive=--cpu-placement=shared;OMP_WAIT_POLICY=PASSIVE'

Each variant is `NAME=FLAG[,FLAG...][;ENV=VALUE...]`: `folio serve` flags and environment
for the server's processes (without a --cpu-placement, `folio serve`'s own default).
Variants run one after another in each round (A B A B), on the same workload as
bench/serve.py (random token-id prompts, `ignore_eos`, greedy, streamed), with the client
on the same machine. Reports output tok/s, TPOT and TTFT p50, the cores
the executor got and the CPU seconds of the frontend and scheduler, with the load average
before each run.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench.data_parallel import add_race_args, measured_run, resolve_vocabulary  # noqa: E402

DEFAULT_VARIANTS = ("split=--cpu-placement=split", "auto=--cpu-placement=auto")
PROCESSES = ("folio-executor", "folio-frontend", "folio-scheduler")


def parse_variant(text: str) -> tuple[str, list[str], dict[str, str]]:
    name, _, rest = text.partition("=")
    flags_text, _, env_text = rest.partition(";")
    flags = [f for f in flags_text.split(",") if f]
    env = dict(item.split("=", 1) for item in env_text.split(";") if item)
    if not name:
        raise SystemExit(f"variant {text!r}: NAME=FLAG[,FLAG...][;ENV=VALUE...]")
    return name, flags, env


def one_run(name: str, flags: list[str], env: dict[str, str], args, seed: int) -> dict:
    report, cpu = measured_run(args, seed, 1, flags, env, PROCESSES)
    return {"variant": name, "flags": flags, "env": env, **report,
            "executor_cores_used": cpu["folio-executor"] / report["duration_s"],
            "frontend_cpu_s": cpu["folio-frontend"],
            "scheduler_cpu_s": cpu["folio-scheduler"]}


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--variant", action="append", default=None,
                        help="NAME=FLAG[,FLAG...][;ENV=VALUE...] (repeatable)")
    add_race_args(parser, concurrency=64)
    args = parser.parse_args(argv)
    resolve_vocabulary(args)
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
