"""Speculative decoding on vs off through `folio serve` (one step in flight): copy-heavy prompts
("repeat this text" + a paragraph of Python's pydoc_data topics, the model's chat template
applied) and a random workload (random token ids, nothing to copy), at several
concurrencies, for each mode (off, n-gram, suffix), each server started in turn
(bench/serve_process.py) and the order of the modes alternated round by round. Greedy,
`ignore_eos`; every mode's answers are checked identical to the first mode's. Prints one
JSON line per run (with the load average before and after it: the machine may be shared)
and writes them to --out, plus a PNG (--png) of output tok/s against concurrency.

    python -m bench.spec_decode_served --model /tmp/smol/f32 --rounds 1 \
        --concurrency 1 4 64 --out spec.jsonl --png docs/images/speculative_served.png
    python -m bench.spec_decode_served --plot spec.jsonl --png spec.png   # redraw only
    python -m bench.spec_decode_served --model /tmp/smol/f32 --serve-model SMOL-q8_0.gguf \
        --modes off ngram suffix llama.cpp llama.cpp-ngram-simple llama.cpp-ngram-mod \
        --llama-server .folio-cache/peers/llama.cpp/11040.0.0/build/bin/llama-server \
        --llama-gguf SMOL-q8_0.gguf --concurrency 1    # against llama.cpp's n-gram speculation
"""

from __future__ import annotations

import argparse
import json
import os
import random
import time
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from bench import serve_process

TOPICS = ("assert", "assignment", "async", "booleans", "calls", "class", "comparisons",
          "compound", "dict", "exceptions", "for", "function", "global", "import", "try",
          "raise")
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


def _post(base_url: str, body: dict) -> dict:
    request = urllib.request.Request(f"{base_url}/v1/completions",
                                     data=json.dumps(body).encode(),
                                     headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=1800) as response:
        return json.loads(response.read())


def _serve(mode: str, args) -> serve_process.Server:
    """The mode's server, ready: llama-server for the llama.cpp modes, else `folio serve`."""
    if mode not in LLAMA_MODES:
        spec = MODES[mode]
        return serve_process.start(args.serve_model or args.model, [
            "--dtype", "float32", *args.folio_arg,
            *(["--speculative-config", json.dumps(spec)] if spec else [])])
    top = max(args.concurrency)
    context = top * (max(args.random_len, 1024) + args.max_tokens + 64)
    server = serve_process.Server(mode, [
        str(args.llama_server), "-m", str(args.llama_gguf), "--host", "127.0.0.1", "--port",
        "PORT", "-np", str(top), "-c", str(context), *LLAMA_MODES[mode]])
    server.wait_ready()
    return server


def copy_prompt(tokenizer, chars: int, index: int = 0) -> list[int]:
    """The chat-templated "repeat this text" prompt over one of pydoc's topics."""
    import pydoc_data.topics

    text = pydoc_data.topics.topics[TOPICS[index % len(TOPICS)]][:chars]
    content = "Repeat the following text exactly, word for word:\n\n" + text
    if not getattr(tokenizer, "chat_template", None):
        return tokenizer.encode(content)
    text = tokenizer.apply_chat_template([{"role": "user", "content": content}],
                                         add_generation_prompt=True, tokenize=False)
    return tokenizer.encode(text, add_special_tokens=False)


def random_prompt(vocab: int, length: int, index: int) -> list[int]:
    rng = random.Random(1000 + index)
    return [rng.randrange(100, vocab) for _ in range(length)]


def _run(base_url: str, model: str, prompts: list[list[int]], max_tokens: int
         ) -> tuple[float, list[str]]:
    """Every prompt at once; output tok/s over the whole batch, and the answers."""
    body = {"model": model, "max_tokens": max_tokens, "temperature": 0, "ignore_eos": True}
    start = time.perf_counter()
    with ThreadPoolExecutor(len(prompts)) as pool:
        answers = list(pool.map(lambda p: _post(base_url, {**body, "prompt": p}), prompts))
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
            server = _serve(mode, args)
            engine = "llama.cpp" if mode in LLAMA_MODES else "folio"
            try:
                with urllib.request.urlopen(f"{server.base_url}/v1/models",
                                            timeout=60) as response:
                    model = json.loads(response.read())["data"][0]["id"]
                _post(server.base_url, {"model": model, "prompt": "hi",   # warm-up
                                        "max_tokens": 2})
                for workload, prompts in workloads.items():
                    for users in args.concurrency:
                        before = os.getloadavg()[0]
                        tok_s, texts = _run(server.base_url, model, prompts[:users],
                                            args.max_tokens)
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
                server.stop()
    return rows


def plot(rows: list[dict], out: Path) -> None:
    from bench.serve_plot import median_line, plt   # matplotlib: the `bench` extra

    workloads = sorted({r["workload"] for r in rows})
    fig, axes = plt.subplots(1, len(workloads), figsize=(5.5 * len(workloads), 4))
    for ax, workload in zip(axes if len(workloads) > 1 else [axes], workloads):
        for mode in (*MODES, *LLAMA_MODES):
            points = [(r["concurrency"], r["tok_s"]) for r in rows
                      if r["workload"] == workload and r["mode"] == mode]
            if not points:
                continue
            xs = median_line(ax, points, mode)
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
