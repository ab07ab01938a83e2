"""Speculative decoding on vs off through `folio serve` (one step in flight): the copy-heavy
prompts of bench/speculative.py and a random workload (random token ids, nothing to copy),
at several concurrencies, for each mode (off, n-gram, suffix), each server started in turn
and the order of the modes alternated round by round. Greedy, `ignore_eos`; every mode's
answers are checked identical to the first mode's. Prints one JSON line per run (with the
load average before and after it: the machine may be shared) and writes them to --out,
plus a PNG (--png) of output tok/s against concurrency.

    python -m bench.speculative_served --model /tmp/smol/f32 --rounds 1 \
        --concurrency 1 4 64 --out spec.jsonl --png docs/images/speculative_served.png
    python -m bench.speculative_served --plot spec.jsonl --png spec.png   # redraw only
    python -m bench.speculative_served --model /tmp/smol/f32 --serve-model SMOL-q8_0.gguf \
        --modes off ngram suffix llama.cpp llama.cpp-ngram-simple llama.cpp-ngram-mod \
        --llama-server .folio-cache/peers/llama.cpp/11040.0.0/build/bin/llama-server \
        --llama-gguf SMOL-q8_0.gguf --concurrency 1    # against llama.cpp's n-gram speculation
"""

from __future__ import annotations

import argparse
import json
import os
import random
import signal
import subprocess
import sys
import time
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from bench.speculative import copy_prompt

MODES = {
    "off": None,
    "ngram": {"method": "ngram", "num_speculative_tokens": 4},
    "suffix": {"method": "suffix", "num_speculative_tokens": 8},
}
# llama.cpp's llama-server (--llama-server, on --llama-gguf) with its own n-gram speculation
# at its defaults (ngram-simple: lookup 12, up to 48 drafts; ngram-mod: match 24, 48-64).
LLAMA_MODES = {
    "llama.cpp": [],
    "llama.cpp-ngram-simple": ["--spec-type", "ngram-simple"],
    "llama.cpp-ngram-mod": ["--spec-type", "ngram-mod"],
}


def _post(port: int, body: dict) -> dict:
    request = urllib.request.Request(f"http://127.0.0.1:{port}/v1/completions",
                                     data=json.dumps(body).encode(),
                                     headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=1800) as response:
        return json.loads(response.read())


def _command(mode: str, args) -> list[str]:
    if mode in LLAMA_MODES:
        top = max(args.concurrency)
        context = top * (max(args.random_len, 1024) + args.max_tokens + 64)
        return [str(args.llama_server), "-m", str(args.llama_gguf), "--host", "127.0.0.1",
                "--port", str(args.port), "-np", str(top), "-c", str(context),
                *LLAMA_MODES[mode]]
    spec = MODES[mode]
    return ([sys.executable, "-m", "folio", "serve", "--model", args.serve_model or args.model,
             "--port", str(args.port), "--dtype", "float32", *args.folio_arg]
            + (["--speculative-config", json.dumps(spec)] if spec else []))


def _serve(command: list[str], port: int) -> subprocess.Popen:
    proc = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=1):
                return proc
        except OSError:
            time.sleep(0.5)
    proc.kill()
    raise TimeoutError("folio serve did not come up")


def random_prompt(vocab: int, length: int, index: int) -> list[int]:
    rng = random.Random(1000 + index)
    return [rng.randrange(100, vocab) for _ in range(length)]


def _run(port: int, model: str, prompts: list[list[int]], max_tokens: int
         ) -> tuple[float, list[str]]:
    """Every prompt at once; output tok/s over the whole batch, and the answers."""
    body = {"model": model, "max_tokens": max_tokens, "temperature": 0, "ignore_eos": True}
    start = time.perf_counter()
    with ThreadPoolExecutor(len(prompts)) as pool:
        answers = list(pool.map(lambda p: _post(port, {**body, "prompt": p}), prompts))
    seconds = time.perf_counter() - start
    tokens = sum(a["usage"]["completion_tokens"] for a in answers)
    return tokens / seconds, [a["choices"][0]["text"] for a in answers]


def measure(args) -> list[dict]:
    from folio.shared.hf_tokenizer import load_tokenizer

    tokenizer = load_tokenizer(args.model)
    vocab = json.loads((Path(args.model) / "config.json").read_text())["vocab_size"]
    top = max(args.concurrency)
    workloads = {"copy": [copy_prompt(tokenizer, args.chars, i) for i in range(top)],
                 "random": [random_prompt(vocab, args.random_len, i) for i in range(top)]}
    modes = [m for m in (*MODES, *LLAMA_MODES) if m in args.modes]
    rows: list[dict] = []
    answers: dict[tuple[str, int], list[str]] = {}   # greedy: every mode answers the same
    for round_index in range(args.rounds):
        order = modes if round_index % 2 == 0 else modes[::-1]
        for mode in order:
            proc = _serve(_command(mode, args), args.port)
            engine = "llama.cpp" if mode in LLAMA_MODES else "folio"
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{args.port}/v1/models",
                                            timeout=60) as response:
                    model = json.loads(response.read())["data"][0]["id"]
                _post(args.port, {"model": model, "prompt": "hi", "max_tokens": 2})   # warm-up
                for workload, prompts in workloads.items():
                    for users in args.concurrency:
                        before = os.getloadavg()[0]
                        tok_s, texts = _run(args.port, model, prompts[:users], args.max_tokens)
                        # each engine against its own first mode (their numerics differ)
                        expected = answers.setdefault((engine, workload, users), texts)
                        same = sum(a == b for a, b in zip(expected, texts))
                        row = {"round": round_index, "mode": mode, "workload": workload,
                               "concurrency": users, "tok_s": round(tok_s, 1),
                               "identical": f"{same}/{users}",
                               "load": [round(before, 1), round(os.getloadavg()[0], 1)]}
                        rows.append(row)
                        print(json.dumps(row), flush=True)
            finally:
                proc.send_signal(signal.SIGTERM)
                proc.wait(timeout=60)
    return rows


def plot(rows: list[dict], out: Path) -> None:
    import statistics

    import matplotlib

    matplotlib.use("Agg")   # files only, no display
    import matplotlib.pyplot as plt

    workloads = sorted({r["workload"] for r in rows})
    fig, axes = plt.subplots(1, len(workloads), figsize=(5.5 * len(workloads), 4))
    for ax, workload in zip(axes if len(workloads) > 1 else [axes], workloads):
        for mode in (*MODES, *LLAMA_MODES):
            points = [(r["concurrency"], r["tok_s"]) for r in rows
                      if r["workload"] == workload and r["mode"] == mode]
            if not points:
                continue
            xs = sorted({x for x, _ in points})
            ys = [statistics.median(y for x2, y in points if x2 == x) for x in xs]
            line, = ax.plot(xs, ys, marker="o", label=mode)
            ax.scatter([x for x, _ in points], [y for _, y in points], s=10,
                       color=line.get_color(), alpha=0.5)
        ax.set_xscale("log", base=2)
        ax.set_xticks(xs, [str(x) for x in xs])
        ax.set_ylim(bottom=0)
        ax.set_xlabel("concurrent requests")
        ax.set_ylabel("output tok/s")
        ax.set_title(f"{workload} workload")
        ax.legend()
    loads = [value for r in rows for value in r["load"]]
    fig.suptitle("Speculative decoding served (SmolLM2-135M-Instruct, 2-core VM, "
                 f"load {min(loads):.1f}-{max(loads):.1f})", fontsize=10)
    fig.tight_layout()
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=110)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--model")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--concurrency", type=int, nargs="+", default=[1, 4, 64])
    parser.add_argument("--modes", nargs="+", default=list(MODES),
                        choices=[*MODES, *LLAMA_MODES])
    parser.add_argument("--serve-model", help="what folio serves (default --model; e.g. a "
                        "GGUF file of it); --model gives the tokenizer and vocabulary")
    parser.add_argument("--folio-arg", action="append", default=[],
                        help="extra folio serve argument (repeat; --folio-arg=--flag)")
    parser.add_argument("--llama-server", type=Path, help="llama-server binary (the llama.cpp "
                        "modes; bench/llama_cpp_build.py builds it)")
    parser.add_argument("--llama-gguf", type=Path, help="the GGUF llama-server serves")
    parser.add_argument("--max-tokens", type=int, default=64)
    parser.add_argument("--chars", type=int, default=1200)
    parser.add_argument("--random-len", type=int, default=256)
    parser.add_argument("--port", type=int, default=18431)
    parser.add_argument("--out", type=Path, help="the runs, one JSON line each")
    parser.add_argument("--png", type=Path)
    parser.add_argument("--plot", type=Path, help="only draw --png from these runs")
    args = parser.parse_args()
    if args.plot is not None:
        rows = [json.loads(line) for line in args.plot.read_text().splitlines() if line]
    else:
        if not args.model:
            parser.error("--model is needed to measure")
        if set(args.modes) & set(LLAMA_MODES) and not (args.llama_server and args.llama_gguf):
            parser.error("the llama.cpp modes need --llama-server and --llama-gguf")
        rows = measure(args)
        if args.out is not None:
            args.out.write_text("".join(json.dumps(r) + "\n" for r in rows))
    if args.png is not None:
        plot(rows, args.png)


if __name__ == "__main__":
    main()
