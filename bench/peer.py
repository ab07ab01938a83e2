"""Offline race: Folio vs vLLM's CPU build (and transformers once), same workload, one run.

    python bench/peer.py --rounds 3                          # Folio, vLLM, Folio, vLLM, ...
    python bench/peer.py --rounds 3 --with-hf                # plus transformers, once
    python bench/peer.py --skip-vllm --num-requests 8        # Folio only

The workload is bench/throughput.py's (same checkpoint, 64 requests, greedy, float32, EOS
ignored). Each engine runs in a fresh process per round, Folio and vLLM alternating; vLLM
runs with the peer virtual environment's python (`--vllm-python`) through
bench/peer_vllm_runner.py, which needs only vLLM. Each figure carries the load average
(1 min) read before and after it. Both engines' greedy tokens are compared request by
request. The fraction of the matmul floor uses bench/peer_floor.py: the workload's FLOPs
over a matmul rate measured here at the model's shapes (`--floor-threads`, default 2), or
the rate you give (`--matmul-gflops`).

Writes OUT.json (every figure) and OUT.png (a bar chart of tok/s per round).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench.peer_floor import floor, measure_matmul, workload_flops   # noqa: E402
from bench.throughput import (MODEL_SHAPE, add_workload_args, build_model, run_folio,  # noqa: E402
                              run_hf, workload)

DEFAULT_VLLM_PYTHON = Path("/work/peer/vllm-venv/bin/python")


def _worker(args) -> None:
    """One engine, one round, in this (fresh) process; writes its result as JSON."""
    prompts, outputs = workload(args.num_requests, args.seed)
    model = Path(args.model_dir)
    result = (run_folio(model, prompts, outputs, args) if args.worker == "folio"
              else run_hf(model, prompts, outputs))
    Path(args.worker_out).write_text(json.dumps(result))


def _common_flags(args) -> list[str]:
    flags = ["--num-requests", str(args.num_requests), "--seed", str(args.seed),
             "--model-dir", str(args.model_dir), "--block-size", str(args.block_size),
             "--max-num-batched-tokens", str(args.max_num_batched_tokens)]
    if args.num_kv_blocks is not None:
        flags += ["--num-kv-blocks", str(args.num_kv_blocks)]
    return flags


def _run(command: list[str], log: Path, env: dict, timeout: float) -> None:
    with open(log, "wb") as out:
        proc = subprocess.run(command, stdout=out, stderr=subprocess.STDOUT, env=env,
                              cwd=ROOT, timeout=timeout)
    if proc.returncode != 0:
        tail = log.read_text(errors="replace")[-3000:]
        raise RuntimeError(f"{command[0]} exited {proc.returncode}; log {log}:\n{tail}")


def _round(engine: str, args, work_dir: Path, index: int, expected: int) -> dict:
    out = work_dir / f"{engine}-{index}.json"
    log = work_dir / f"{engine}-{index}.log"
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    if engine == "vllm":
        env.setdefault("VLLM_CPU_KVCACHE_SPACE", str(args.vllm_kv_cache_gib))
        command = [str(args.vllm_python), str(ROOT / "bench" / "peer_vllm_runner.py"),
                   "--model", str(args.model_dir), "--workload", str(work_dir / "workload.json"),
                   "--out", str(out), "--engine-kwargs", args.vllm_engine_kwargs]
    else:
        command = [sys.executable, str(Path(__file__).resolve()), "--worker", engine,
                   "--worker-out", str(out), *_common_flags(args)]
    before = os.getloadavg()
    _run(command, log, env, args.round_timeout)
    after = os.getloadavg()
    result = json.loads(out.read_text())
    figure = {"engine": engine, "round": index, "tok_per_s": result["tok_per_s"],
              "seconds": result["seconds"], "output_tokens": result["output_tokens"],
              "loadavg_1m_before": before[0], "loadavg_1m_after": after[0],
              "loadavg_before": list(before), "loadavg_after": list(after)}
    print(f"round {index} {engine:12s} {result['tok_per_s']:8.1f} tok/s "
          f"({result['seconds']:.1f} s)  load {before[0]:.2f} -> {after[0]:.2f}", flush=True)
    if result["output_tokens"] != expected:   # tok/s would compare different work
        print(f"  WARNING: {engine} made {result['output_tokens']} output tokens, the "
              f"workload asks for {expected}", flush=True)
    return {"figure": figure, "token_ids": result.get("token_ids"),
            "extra": {k: v for k, v in result.items() if k not in ("token_ids",)}}


def compare_tokens(a: list[list[int]], b: list[list[int]]) -> dict:
    """How many requests match exactly, and where the others first diverge."""
    exact, firsts = 0, []
    for x, y in zip(a, b):
        if x == y:
            exact += 1
            continue
        firsts.append(next((i for i, (p, q) in enumerate(zip(x, y)) if p != q),
                           min(len(x), len(y))))
    return {"requests": len(a), "exact": exact, "differ": len(a) - exact,
            "first_divergence_positions": firsts}


def _median(rounds: list[dict], engine: str) -> float | None:
    values = [r["tok_per_s"] for r in rounds if r["engine"] == engine]
    return statistics.median(values) if values else None


def _environment(args) -> dict:
    import torch

    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT,
                            capture_output=True, text=True).stdout.strip()
    cpu = next((line.split(":", 1)[1].strip() for line in
                Path("/proc/cpuinfo").read_text().splitlines()
                if line.startswith("model name")), platform.processor())
    return {"date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), "commit": commit,
            "cpu": cpu, "cpus": os.cpu_count(), "torch": torch.__version__,
            "python": platform.python_version(),
            "thread_env": {k: v for k, v in os.environ.items()
                           if k.startswith(("OMP_", "MKL_", "VLLM_CPU_", "FOLIO_"))},
            "vllm_cpu_kvcache_space_gib": os.environ.get("VLLM_CPU_KVCACHE_SPACE",
                                                         str(args.vllm_kv_cache_gib))}


def _floor_report(args, prompts, outputs) -> dict:
    flops = workload_flops(MODEL_SHAPE, prompts, outputs)
    if args.matmul_gflops is not None:
        rates = {"source": "given (--matmul-gflops)", "decode_gflops": args.matmul_gflops,
                 "prefill_gflops": args.matmul_gflops}
    else:
        print(f"measuring the matmul rate at the model's shapes on {args.floor_threads} "
              "threads ...", flush=True)
        rates = {"source": f"measured here, best of MKL and oneDNN per shape, "
                           f"{args.floor_threads} threads",
                 **measure_matmul(MODEL_SHAPE, args.floor_threads)}
    result = floor(flops, rates["decode_gflops"], rates["prefill_gflops"], sum(outputs))
    return {"flops": flops, "rate": rates, **result}


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=2, help="Folio/vLLM pairs, alternated")
    add_workload_args(parser)
    parser.add_argument("--vllm-python", type=Path, default=DEFAULT_VLLM_PYTHON)
    parser.add_argument("--vllm-engine-kwargs", default="{}",
                        help="JSON object of extra vllm.LLM arguments (default: vLLM's own)")
    parser.add_argument("--vllm-kv-cache-gib", type=int, default=1,
                        help="VLLM_CPU_KVCACHE_SPACE when unset (Folio's default is 1 GiB)")
    parser.add_argument("--skip-vllm", action="store_true")
    parser.add_argument("--with-hf", action="store_true", help="transformers once, at the end")
    parser.add_argument("--matmul-gflops", type=float, default=None,
                        help="use this matmul rate for the floor instead of measuring one")
    parser.add_argument("--floor-threads", type=int, default=2)
    parser.add_argument("--skip-floor", action="store_true")
    parser.add_argument("--round-timeout", type=float, default=1800)
    parser.add_argument("--out", type=Path, default=ROOT / ".folio-cache" / "peer" / "peer",
                        help="writes OUT.json and OUT.png, keeps logs in OUT-runs/")
    parser.add_argument("--worker", choices=("folio", "hf"), help=argparse.SUPPRESS)
    parser.add_argument("--worker-out", help=argparse.SUPPRESS)
    return parser.parse_args(argv)


def main(argv=None) -> None:
    args = parse_args(argv)
    if args.worker:
        _worker(args)
        return
    use_vllm = not args.skip_vllm
    if use_vllm and not args.vllm_python.exists():
        sys.exit(f"vLLM's python {args.vllm_python} does not exist: install vLLM's CPU build "
                 "in its own virtual environment (see docs/benchmarks.md), pass "
                 "--vllm-python, or run Folio only with --skip-vllm")
    model = build_model(args.model_dir)
    prompts, outputs = workload(args.num_requests, args.seed)
    work_dir = Path(f"{args.out}-runs")
    work_dir.mkdir(parents=True, exist_ok=True)
    (work_dir / "workload.json").write_text(json.dumps({"prompts": prompts,
                                                        "outputs": outputs}))
    report: dict = {"model": str(model), "model_shape": MODEL_SHAPE,
                    "requests": len(prompts), "prompt_tokens": sum(map(len, prompts)),
                    "output_tokens": sum(outputs), "environment": _environment(args)}
    if not args.skip_floor:
        report["floor"] = _floor_report(args, prompts, outputs)
    rounds, tokens, extras = [], {}, {}
    consistent: dict[str, bool] = {}
    order = ["folio", "vllm"] if use_vllm else ["folio"]
    for index in range(1, args.rounds + 1):
        for engine in order:
            done = _round(engine, args, work_dir, index, sum(outputs))
            rounds.append(done["figure"])
            first = tokens.setdefault(engine, done["token_ids"])
            consistent[engine] = consistent.get(engine, True) and first == done["token_ids"]
            extras.setdefault(engine, done["extra"])
    if args.with_hf:
        done = _round("hf", args, work_dir, 1, sum(outputs))
        rounds.append(done["figure"])
    report["rounds"] = rounds
    report["same_tokens_every_round"] = consistent
    report["folio_run"] = {k: extras["folio"].get(k) for k in (
        "peak_running", "peak_kv_blocks", "kv_slot_utilization_at_peak", "max_model_len")}
    report["median_tok_per_s"] = {e: _median(rounds, e) for e in ("folio", "vllm", "hf")
                                  if _median(rounds, e) is not None}
    med = report["median_tok_per_s"]
    if "vllm" in med:
        report["ratio_folio_over_vllm"] = med["folio"] / med["vllm"]
        pairs = zip([r for r in rounds if r["engine"] == "folio"],
                    [r for r in rounds if r["engine"] == "vllm"])
        report["ratio_per_round"] = [a["tok_per_s"] / b["tok_per_s"] for a, b in pairs]
        report["vllm_version"] = extras["vllm"].get("vllm_version")
        report["vllm_engine_kwargs"] = extras["vllm"].get("engine_kwargs")
        report["tokens_folio_vs_vllm"] = compare_tokens(tokens["folio"], tokens["vllm"])
    if "hf" in med:
        report["ratio_folio_over_hf"] = med["folio"] / med["hf"]
    if "floor" in report:
        report["fraction_of_floor"] = {e: v / report["floor"]["tok_per_s"]
                                       for e, v in med.items()}
    _write(report, args.out)


def _write(report: dict, out: Path) -> None:
    out.parent.mkdir(parents=True, exist_ok=True)
    json_path = out.with_name(out.name + ".json")
    json_path.write_text(json.dumps(report, indent=2))
    print(f"report: {json_path}")
    med = report["median_tok_per_s"]
    for engine, value in med.items():
        share = report.get("fraction_of_floor", {}).get(engine)
        extra = f", {100 * share:.1f}% of the matmul floor" if share is not None else ""
        print(f"  {engine:6s} median {value:8.1f} tok/s{extra}")
    if "ratio_folio_over_vllm" in report:
        match = report["tokens_folio_vs_vllm"]
        print(f"  Folio / vLLM {report['ratio_folio_over_vllm']:.2f}x; identical greedy "
              f"tokens on {match['exact']} of {match['requests']} requests")
    if "floor" in report:
        print(f"  matmul floor {report['floor']['tok_per_s']:.0f} tok/s "
              f"({report['floor']['flops']['total'] / 1e12:.3f} TFLOP)")
    try:
        from bench.peer_plot import plot
    except ImportError as error:   # matplotlib is in the `bench` extra
        print(f"no chart: {error} (pip install -e '.[bench]' -c constraints.txt)")
        return
    png = out.with_name(out.name + ".png")
    plot(report, png)
    print(f"chart:  {png}")


if __name__ == "__main__":
    main()
