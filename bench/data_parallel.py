"""Data-parallel scaling on one machine: `folio serve --data-parallel-size 2` (one core per
replica's executor) against one replica whose executor has one core, both under the
serving benchmark (bench/serve.py's workload and measurement), alternated.

    python bench/data_parallel.py --rounds 2 -o dp.json            # the built-in model
    python bench/data_parallel.py --model DIR --num-prompts 128 --max-concurrency 64

One replica runs with --cpu-placement split on two cores (executor on one core, frontend and
scheduler on the other); two replicas put executor i on core i, the frontend and the
schedulers unpinned. Reports output tokens/s of each run, the best of each side, and their
ratio, with the load average before each run; and, since a shared machine's other work
takes cores from either side unevenly, the cores the executors actually got (their CPU
seconds over the run's duration) and output tokens per executor CPU second.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench.serve import add_workload_args, build_workload, run_benchmark  # noqa: E402


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def start(replicas: int, model: str | None, extra: list[str],
          env: dict[str, str] | None = None) -> tuple[subprocess.Popen, str]:
    port = _free_port()
    cmd = [sys.executable, "-m", "folio", "--log-level", "WARNING", "serve", "--port",
           str(port), "--data-parallel-size", str(replicas), *extra]
    if model:
        cmd += ["--model", model]
    proc = subprocess.Popen(cmd, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                            env=dict(os.environ, PYTHONPATH=str(ROOT), **(env or {})))
    base = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise SystemExit(f"folio serve --data-parallel-size {replicas} exited")
        try:
            with urllib.request.urlopen(f"{base}/health", timeout=1) as response:
                body = json.load(response)
            if all(r["status"] == "ok" for r in body.get("replicas", [{"status": "ok"}])):
                return proc, base
        except OSError:
            pass
        time.sleep(0.5)
    proc.kill()
    raise SystemExit("server not ready")


def stop(proc: subprocess.Popen, timeout: float = 60) -> None:
    proc.send_signal(signal.SIGTERM)
    try:
        proc.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


def children_cpu_s(parent: int, name_prefix: str) -> float:
    """CPU seconds used so far by the children of `parent` whose name starts so."""
    tick = os.sysconf("SC_CLK_TCK")
    total = 0.0
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue
        name = stat[stat.index("(") + 1:stat.rindex(")")]
        fields = stat[stat.rindex(")") + 2:].split()
        if name.startswith(name_prefix) and int(fields[1]) == parent:
            total += (int(fields[11]) + int(fields[12])) / tick
    return total


def measured_run(args, seed: int, replicas: int, flags: list[str],
                 env: dict[str, str] | None = None,
                 processes: tuple[str, ...] = ("folio-executor",)) -> tuple[dict, dict]:
    """One `folio serve` under the serving benchmark's workload: its report, and the CPU
    seconds each named kind of child process used during the run."""
    proc, base = start(replicas, args.model, flags, env)
    try:
        prompts = build_workload(args, seed=seed)
        before = {name: children_cpu_s(proc.pid, name) for name in processes}
        report = asyncio.run(run_benchmark(
            base, prompts, args.output_len, model=None, max_concurrency=args.max_concurrency,
            request_rate=float("inf"), seed=seed, request_timeout=args.request_timeout,
            deadline=args.deadline))
        return report, {name: children_cpu_s(proc.pid, name) - before[name]
                        for name in processes}
    finally:
        stop(proc)


def add_race_args(parser: argparse.ArgumentParser, concurrency: int) -> None:
    """The flags this bench and bench/placement.py share, the workload's included."""
    parser.add_argument("--model", default=None, help="checkpoint (default: the built-in)")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--max-concurrency", type=int, default=concurrency)
    parser.add_argument("-o", "--out", type=Path, default=None)
    add_workload_args(parser)


def resolve_vocabulary(args) -> None:
    """Without --model-dir or --vocab-size, the prompts use the served model's vocabulary."""
    if args.model_dir is None and args.vocab_size is None:
        from folio.cli import resolve_model

        args.model_dir = Path(resolve_model(args.model))


def one_run(replicas: int, args, seed: int) -> dict:
    flags = list(args.serve_arg)
    if replicas == 1 and not any(f.startswith("--cpu-placement") for f in flags):
        flags += ["--cpu-placement", "split"]   # the baseline: one replica on one core
    report, used = measured_run(args, seed, replicas, flags,
                                processes=("folio-executor", "folio-frontend", "folio-scheduler"))
    cpu = used["folio-executor"]
    # Load-independent view: the cores the executors actually got during the run, and
    # output tokens per executor CPU second (equal on both sides: replicas cost nothing).
    return {"replicas": replicas, **report, "executor_cpu_s": cpu,
            "executor_cores_used": cpu / report["duration_s"],
            "tokens_per_executor_cpu_s": report["total_output_tokens"] / max(cpu, 1e-9),
            "frontend_cpu_s": used["folio-frontend"], "schedulers_cpu_s": used["folio-scheduler"]}


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--serve-arg", action="append", default=[],
                        help="extra `folio serve` flag (repeatable), e.g. --serve-arg=--seed=1")
    add_race_args(parser, concurrency=32)
    args = parser.parse_args(argv)
    resolve_vocabulary(args)
    runs = []
    for round_ in range(args.rounds):
        for replicas in (1, 2):
            report = one_run(replicas, args, seed=args.seed + round_)
            runs.append(report)
            print(f"round {round_} replicas={replicas}: "
                  f"{report['output_throughput']:.1f} output tok/s, executors used "
                  f"{report['executor_cores_used']:.2f} cores, "
                  f"{report['tokens_per_executor_cpu_s']:.1f} tok per executor CPU s, "
                  f"frontend {report['frontend_cpu_s']:.1f} CPU s, schedulers "
                  f"{report['schedulers_cpu_s']:.1f}, {report['duration_s']:.1f} s "
                  f"(load {report['loadavg_1m_before']:.2f} before, "
                  f"{report['loadavg_1m_after']:.2f} after)", flush=True)
    best = {n: max(r["output_throughput"] for r in runs if r["replicas"] == n) for n in (1, 2)}
    summary = {"runs": runs, "best_output_throughput": best, "speedup": best[2] / best[1]}
    print(f"best: 1 replica {best[1]:.1f}, 2 replicas {best[2]:.1f} output tok/s: "
          f"{summary['speedup']:.2f}x")
    if args.out:
        args.out.write_text(json.dumps(summary, indent=2))


if __name__ == "__main__":
    main()
