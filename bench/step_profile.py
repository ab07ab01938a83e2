"""Where a crowd's decode step goes, per operator, in Folio and in vLLM's CPU build.

    .venv/bin/python bench/step_profile.py --engine folio --model-dir /tmp/smollm2-bf16
    /work/peer/vllm-venv/bin/python bench/step_profile.py --engine vllm --model-dir /tmp/smollm2-bf16
    ... --prompt-len 256 --json > folio.json        # the served race's shape

Both engines run offline in this one process (vLLM with VLLM_ENABLE_V1_MULTIPROCESSING=0, so
its engine core and worker run here too), bfloat16, on the same checkpoint: --users requests of
--prompt-len random token ids, --tokens greedy tokens each, EOS ignored. A first generate warms
up; the second, on other prompts (no prefix-cache hits), runs under torch.profiler (CPU
activity). Each operator's self time is summed
into a category (its name decides; `--top` lists the biggest operators so nothing hides in a
wrong one); `outside operators` is the wall time minus every operator's self time: Python,
scheduling, the engine's own bookkeeping (and the profiler's per-operator cost, which both
engines pay alike). The default shape (16-token prompts) makes the run nearly all decode
steps of --users rows; per step = the category's time / --tokens.

This script imports only torch and the engine under test, so it runs in either venv.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import re
import time
from collections import defaultdict

CATEGORIES = (   # first match wins; matched against the lower-cased operator name
    ("attention", r"attn|attention|paged|sdpa|flash|kv_cache|reshape_and_cache|cache_write"),
    ("matmul", r"linear|matmul|\bmm\b|addmm|bmm|gemm|onednn|mkldnn|dnnl|weight_only|packed"),
    ("norm", r"norm"),
    ("rotary", r"rotary|rope"),
    ("activation", r"silu|gelu|swiglu|act_and_mul|sigmoid"),
    ("sampling", r"sample|argmax|topk|top_k|sort|multinomial|softmax|exponential|logits"),
    ("copies and indexing", r"copy|index|cat|stack|to\b|_to_copy|empty|zeros|fill|select|"
                            r"slice|view|reshape|contiguous|clone|narrow|split|gather|scatter"),
)


def category(name: str) -> str:
    lowered = name.lower()
    for label, pattern in CATEGORIES:
        if re.search(pattern, lowered):
            return label
    return "other operators"


def prompts(users: int, prompt_len: int, vocab: int, seed: int) -> list[list[int]]:
    rng = random.Random(seed)
    return [[rng.randrange(100, vocab - 100) for _ in range(prompt_len)] for _ in range(users)]


def folio_runner(args):
    from folio import LLM, SamplingParams

    llm = LLM(args.model_dir, dtype="bfloat16", skip_tokenizer_init=True, device="cpu",
              max_num_seqs=max(args.users, 1), linear_backend=args.linear_backend)
    vocab = llm.engine.executor.model_config.vocab_size
    params = SamplingParams(temperature=0, max_tokens=args.tokens, ignore_eos=True)
    return lambda seed: llm.generate(prompts(args.users, args.prompt_len, vocab, seed), params)


def vllm_runner(args):
    os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
    from vllm import LLM, SamplingParams
    from vllm.inputs import TokensPrompt

    llm = LLM(args.model_dir, dtype="bfloat16", max_num_seqs=max(args.users, 1))
    vocab = llm.llm_engine.model_config.get_vocab_size()
    params = SamplingParams(temperature=0, max_tokens=args.tokens, ignore_eos=True)
    return lambda seed: llm.generate(
        [TokensPrompt(prompt_token_ids=p) for p in prompts(args.users, args.prompt_len, vocab,
                                                           seed)], params, use_tqdm=False)


def profile(run) -> tuple[float, dict[str, float]]:
    import torch

    run(1)             # warm-up: kernels, caches, first allocations (other prompts: no
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
        start = time.perf_counter()          # prefix-cache hit in the profiled run)
        run(2)
        wall = time.perf_counter() - start
    ops = {e.key: e.self_cpu_time_total / 1e6 for e in prof.key_averages()}
    return wall, ops


def plot(png: str, runs: list[str]) -> None:
    """One horizontal bar per run: its ms per step, split by category."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    results = [json.loads(open(path).read().strip().splitlines()[-1]) for path in runs]
    labels = [label for label, _ in CATEGORIES] + ["other operators", "outside operators"]
    fig, ax = plt.subplots(figsize=(9, 1 + 0.6 * len(results)))
    for row, result in enumerate(results):
        left = 0.0
        for index, label in enumerate(labels):
            ms = result["split_s"].get(label, 0.0) * 1e3 / result["tokens"]
            ax.barh(row, ms, left=left, color=plt.cm.tab10(index),
                    label=label if row == 0 else None)
            left += ms
    ax.set_yticks(range(len(results)),
                  [f"{r['label']}: {r['users']} user{'s' if r['users'] != 1 else ''}"
                   for r in results])
    ax.set_xlabel("ms per step (profiled run / output tokens)")
    ax.legend(loc="upper center", bbox_to_anchor=(0.5, -0.35), ncol=5, fontsize=8)
    fig.tight_layout()
    fig.savefig(png, dpi=120)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--engine", choices=("folio", "vllm"))
    parser.add_argument("--model-dir")
    parser.add_argument("--users", type=int, default=64)
    parser.add_argument("--prompt-len", type=int, default=16)
    parser.add_argument("--tokens", type=int, default=64)
    parser.add_argument("--top", type=int, default=12)
    parser.add_argument("--linear-backend", default="auto",
                        help="Folio's linear_backend (onednn: the oneDNN bfloat16 path)")
    parser.add_argument("--label", help="the run's name in --json output and the plot")
    parser.add_argument("--json", action="store_true")
    parser.add_argument("--plot", nargs="+", metavar=("PNG", "JSON"),
                        help="draw the per-step split of earlier --json runs into PNG")
    args = parser.parse_args()
    if args.plot:
        plot(args.plot[0], args.plot[1:])
        return
    load = os.getloadavg()
    run = (folio_runner if args.engine == "folio" else vllm_runner)(args)
    wall, ops = profile(run)
    split: dict[str, float] = defaultdict(float)
    for name, seconds in ops.items():
        split[category(name)] += seconds
    split["outside operators"] = max(wall - sum(ops.values()), 0.0)
    top = sorted(ops.items(), key=lambda item: -item[1])[:args.top]
    result = {"engine": args.engine, "label": args.label or args.engine, "users": args.users, "prompt_len": args.prompt_len,
              "tokens": args.tokens, "wall_s": wall, "load_average": load,
              "split_s": dict(split), "top_ops_s": dict(top)}
    if args.json:
        print(json.dumps(result))
        return
    per_step = 1e3 / args.tokens
    print(f"{args.engine}: {args.users} users x ({args.prompt_len} in, {args.tokens} out), "
          f"wall {wall:.2f} s under the profiler, load {load[0]:.2f}")
    for label, seconds in sorted(split.items(), key=lambda item: -item[1]):
        print(f"  {label:<22} {seconds:7.3f} s {seconds / wall:6.1%} {seconds * per_step:8.2f} "
              "ms/step")
    print("  biggest operators:")
    for name, seconds in top:
        print(f"    {name[:60]:<60} {seconds:7.3f} s  [{category(name)}]")


if __name__ == "__main__":
    main()
