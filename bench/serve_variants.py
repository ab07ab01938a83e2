"""`folio serve` under different flag sets, raced under the serving benchmark (A B A B).

    python bench/serve.py variants --model DIR --rounds 2 -o placement.json   # split vs auto
    python bench/serve.py variants --variant split=--cpu-placement=split \\
        --variant shared=--cpu-placement=shared \\
        --variant 'passive=--cpu-placement=shared;OMP_WAIT_POLICY=PASSIVE'
    python bench/serve.py variants --model DIR --num-prompts 128 --max-concurrency 64 \\
        --variant one=--cpu-placement=split --variant dp2=--data-parallel-size=2   # replicas

Each variant is `NAME=FLAG[,FLAG...][;ENV=VALUE...]`: `folio serve` flags and environment
for the server's processes (without a --cpu-placement, `folio serve`'s own default). Each
run starts a fresh server (bench/serve_process.py) and sends it bench/serve_client.py's
workload (random token-id prompts, `ignore_eos`, greedy, streamed), the client on the same
machine. Reports output tok/s, TPOT and TTFT p50, the load average before each run, and,
since a shared machine's other work takes cores from variants unevenly, the cores the
executors actually got (their CPU seconds over the run), output tokens per executor CPU
second and the CPU seconds of the frontend and schedulers.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
from pathlib import Path

from bench.serve_client import add_workload_args, build_workload, run_benchmark
from bench.serve_process import children_cpu_s, start

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


def resolve_vocabulary(args) -> None:
    """Without --model-dir or --vocab-size, the prompts use the served model's vocabulary."""
    if args.model_dir is None and args.vocab_size is None:
        from folio.default_model import resolve_model

        args.model_dir = Path(resolve_model(args.model))


def one_run(name: str, flags: list[str], env: dict[str, str], args, seed: int) -> dict:
    server = start(args.model, flags, env)
    try:
        prompts = build_workload(args, seed=seed)
        pid = server.proc.pid
        before = {kind: children_cpu_s(pid, kind) for kind in PROCESSES}
        report = asyncio.run(run_benchmark(
            server.base_url, prompts, args.output_len, model=None,
            max_concurrency=args.max_concurrency, request_rate=float("inf"), seed=seed,
            request_timeout=args.request_timeout, deadline=args.deadline))
        used = {kind: children_cpu_s(pid, kind) - before[kind] for kind in PROCESSES}
    finally:
        server.stop()
    executor = used["folio-executor"]
    return {"variant": name, "flags": flags, "env": env, **report,
            "executor_cpu_s": executor,
            "executor_cores_used": executor / report["duration_s"],
            "tokens_per_executor_cpu_s": report["total_output_tokens"] / max(executor, 1e-9),
            "frontend_cpu_s": used["folio-frontend"],
            "schedulers_cpu_s": used["folio-scheduler"]}


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(prog="bench/serve.py variants",
                                     description=__doc__.split("\n\n")[0])
    parser.add_argument("--variant", action="append", default=None,
                        help="NAME=FLAG[,FLAG...][;ENV=VALUE...] (repeatable)")
    parser.add_argument("--model", default=None, help="checkpoint (default: the built-in)")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--max-concurrency", type=int, default=64)
    parser.add_argument("-o", "--out", type=Path, default=None)
    add_workload_args(parser)
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
                  f"TTFT p50 {report['ttft_ms']['p50']:.0f} ms, executors on "
                  f"{report['executor_cores_used']:.2f} cores "
                  f"({report['tokens_per_executor_cpu_s']:.1f} tok per CPU s), frontend "
                  f"{report['frontend_cpu_s']:.1f} CPU s, schedulers "
                  f"{report['schedulers_cpu_s']:.1f} CPU s (load "
                  f"{report['loadavg_1m_before']:.2f} before)", flush=True)
    medians = {name: statistics.median(r["output_throughput"] for r in runs
                                       if r["variant"] == name) for name, _, _ in variants}
    print("median out tok/s: " + ", ".join(f"{n} {v:.1f}" for n, v in medians.items()))
    if args.out:
        args.out.write_text(json.dumps({"runs": runs, "median_output_throughput": medians},
                                       indent=2))
