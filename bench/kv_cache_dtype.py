"""Quantized KV cache: the C++ decode attention per layer call over caches stored as float32,
bfloat16, int8 (+ float16 scale per row) and float8, and the tokens per GiB of each.

    python -m bench.kv_cache_dtype [--rounds 5] [--reps 10] [--threads 1 2] [--context 2048]
    python -m bench.kv_cache_dtype --engine MODEL_DIR [--types auto int8] [--decode 32]

Shape: SmolLM2-135M's (9 query heads, 3 KV heads, head_dim 64, 30 layers), --batch decode
rows of --context tokens each, 16-token blocks in shuffled order, float32 queries. Rounds
alternate the cache types (the machine is shared); each figure is the best of --reps calls
within a round, and the table shows the median over rounds, in ms. `err` is the output's
max abs error against the float32 cache over its max abs.

--engine: offline folio.LLM decode on a float32 checkpoint instead, --batch prompts of
--context tokens: a first pass fills the prefix cache, the timed pass decodes --decode
tokens each over the cached prompts (only each prompt's partial last block is recomputed);
rounds alternate the KV types and the median decode tokens/s is printed.
"""

from __future__ import annotations

import argparse
import os
import statistics
import time

import torch

from folio.kernels import cpu_attention
from folio.kernels.kv_quant import kv_storage_dtype, quantize_rows
from folio.shared.kv_cache_dtype import kv_row_bytes

HEADS, KV_HEADS, HEAD_DIM, LAYERS, BLOCK = 9, 3, 64, 30, 16
TYPES = ("auto", "bfloat16", "int8", "fp8_e4m3", "fp8_e5m2")


def _load() -> str:
    return " ".join(f"{x:.2f}" for x in os.getloadavg())


def tokens_per_gib(kv_cache_dtype: str, model_dtype: str = "float32") -> int:
    token_bytes = 2 * LAYERS * KV_HEADS * kv_row_bytes(kv_cache_dtype, model_dtype, HEAD_DIM)
    return 2**30 // token_bytes


def make_decode(batch: int, context: int, seed: int = 0):
    gen = torch.Generator().manual_seed(seed)
    per_seq = -(-context // BLOCK)
    ids = torch.randperm(batch * per_seq, generator=gen).to(torch.int32)
    tables = ids.view(batch, per_seq)
    shape = (batch * per_seq, BLOCK, KV_HEADS, HEAD_DIM)
    key_cache, value_cache = torch.randn(shape, generator=gen), torch.randn(shape, generator=gen)
    query = torch.randn(batch, HEADS, HEAD_DIM, generator=gen)
    lens = torch.full((batch,), context, dtype=torch.int32)
    starts = torch.arange(batch + 1, dtype=torch.int32)
    return query, key_cache, value_cache, tables, lens, starts


def engine_decode(args) -> None:
    import random

    from folio import LLM, SamplingParams

    rng = random.Random(0)
    prompts = [[rng.randrange(10, 4000) for _ in range(args.context)]
               for _ in range(args.batch)]
    rates = {name: [] for name in args.types}
    for _ in range(args.rounds):
        for name in args.types:
            llm = LLM(args.engine, dtype="float32", device="cpu", kv_cache_dtype=name,
                      num_kv_blocks=args.batch * (args.context + args.decode) // BLOCK + 64,
                      max_num_batched_tokens=4096)
            llm.generate(prompts, SamplingParams(temperature=0, max_tokens=1))
            start = time.perf_counter()
            llm.generate(prompts, SamplingParams(temperature=0, max_tokens=args.decode,
                                                 ignore_eos=True))
            rates[name].append(args.batch * args.decode / (time.perf_counter() - start))
            del llm
    print(f"engine decode, {args.batch} x {args.context}-token prompts, {args.decode} "
          f"tokens each; load after {_load()}")
    for name in args.types:
        print(f"{name:<10} {statistics.median(rates[name]):7.1f} tok/s  "
              f"(rounds: {' '.join(f'{r:.1f}' for r in rates[name])})")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--reps", type=int, default=10)
    parser.add_argument("--threads", type=int, nargs="+", default=[1, 2])
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--context", type=int, default=2048)
    parser.add_argument("--engine", help="float32 checkpoint: time folio.LLM decode instead")
    parser.add_argument("--types", nargs="+", default=["auto", "int8"], choices=TYPES)
    parser.add_argument("--decode", type=int, default=32)
    args = parser.parse_args()
    if args.engine:
        engine_decode(args)
        return
    if not cpu_attention.load().ok:
        raise SystemExit(f"CPU operator unavailable: {cpu_attention.load().detail}")
    query, key_cache, value_cache, tables, lens, starts = make_decode(args.batch, args.context)
    caches = {}
    for name in TYPES:
        storage = kv_storage_dtype(name, torch.float32)
        caches[name] = (quantize_rows(key_cache, storage), quantize_rows(value_cache, storage))
    scale = HEAD_DIM ** -0.5

    def call(name):
        return cpu_attention.paged_attention_cpu(query, *caches[name], tables, lens, starts,
                                                 scale)

    exact = call("auto")
    print(f"decode {args.batch} x {args.context} tokens, {HEADS}/{KV_HEADS} heads, "
          f"head_dim {HEAD_DIM}; load {_load()}")
    print(f"{'kv cache':<10} {'thr':>3} {'ms':>7} {'vs f32':>7} {'err':>8} {'tok/GiB':>9}")
    for threads in args.threads:
        torch.set_num_threads(threads)
        times = {name: [] for name in TYPES}
        for _ in range(args.rounds):
            for name in TYPES:
                call(name)
                best = float("inf")
                for _ in range(args.reps):
                    start = time.perf_counter()
                    call(name)
                    best = min(best, time.perf_counter() - start)
                times[name].append(best * 1e3)
        base = statistics.median(times["auto"])
        for name in TYPES:
            ms = statistics.median(times[name])
            out = call(name)
            err = float((out - exact).abs().max() / exact.abs().max())
            label = "float32" if name == "auto" else name
            print(f"{label:<10} {threads:>3} {ms:7.3f} {base / ms:6.2f}x {err:8.4f} "
                  f"{tokens_per_gib(name):>9}")
    print(f"load after: {_load()}")


if __name__ == "__main__":
    main()
