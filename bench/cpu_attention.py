"""CPU paged attention: the C++ operator against the torch reference path, per layer call; or,
with --kv-cache, the operator's decode over caches stored as float32, bfloat16, int8 (+
float16 scale per row) and float8, and the tokens per GiB of each.

    python -m bench.cpu_attention [--reps 20] [--threads 1 2] [--clock wall|cpu]
    python -m bench.cpu_attention --kv-cache [--rounds 5] [--reps 10] [--context 2048]
    python -m bench.cpu_attention --decode [--batches 1 64] [--contexts 16 256 1024 4096]

Cases: 64 decode rows with contexts drawn from 16-768 tokens, one 512-token prompt, and the
two mixed in one call (--decode-contexts changes the range); 8 query heads, 4 KV heads
(--kv-heads), head_dim 64, 16-token blocks in shuffled order, float32. `ref` is
reference.paged_attention_planned (the plan is built once per step and shared by every layer,
so it is timed apart: `plan`). Times: best of --reps, in ms.

--kv-cache: SmolLM2-135M's shape (9 query heads, 3 KV heads, head_dim 64, 30 layers),
--batch decode rows of --context tokens each. Rounds alternate the cache types (the machine
is shared); each figure is the best of --reps calls within a round, and the table shows the
median over rounds, in ms. `err` is the output's max abs error against the float32 cache over
its max abs. Decode speed by KV type end to end: bench/quantized_decode.py --kv-cache-dtypes.

--decode: one decode step's attention calls at SmolLM2-135M's shape, --batches sequences of
one new token each after --contexts tokens, in µs per call. `hot` repeats one call (its
K/V stay in cache); `step` cycles through copies of the caches, 96 MiB or more in all
(`caches` of them), so that each call reads its K/V from memory, as in a model's decode
step, whose weights stream through the cache between two layers' calls. Each figure: per
round, the best of --reps timed loops of calls; then the median and the best over --rounds
rounds. --library times another build of the operators (an older commit's .so), for
before/after figures from one checkout.
"""

from __future__ import annotations

import argparse
import os
import statistics
import time
from pathlib import Path

import torch

from folio.kernels import cpu_attention, reference
from folio.kernels.kv_quant import kv_storage_dtype, quantize_rows
from folio.shared.kv_cache_dtype import kv_row_bytes

HEADS, KV_HEADS, HEAD_DIM, BLOCK = 8, 4, 64, 16
# --kv-cache: SmolLM2-135M's attention
SMOL_HEADS, SMOL_KV_HEADS, SMOL_LAYERS = 9, 3, 30
KV_TYPES = ("auto", "bfloat16", "int8", "fp8_e4m3", "fp8_e5m2")


def make_case(seqs: list[tuple[int, int]], seed: int = 0, heads: int = HEADS,
              kv_heads: int = KV_HEADS):
    """seqs: (cached context, new tokens). Returns the op's arguments."""
    gen = torch.Generator().manual_seed(seed)
    lens = [c + n for c, n in seqs]
    need = [-(-n // BLOCK) for n in lens]
    ids = torch.randperm(sum(need) + 8, generator=gen).to(torch.int32)
    tables = torch.zeros(len(seqs), max(need), dtype=torch.int32)
    used = 0
    for i, n in enumerate(need):
        tables[i, :n] = ids[used:used + n]
        used += n
    cache = (sum(need) + 8, BLOCK, kv_heads, HEAD_DIM)
    key_cache = torch.randn(cache, generator=gen)
    value_cache = torch.randn(cache, generator=gen)
    starts = torch.tensor([0] + [n for _, n in seqs], dtype=torch.int32).cumsum(0)
    query = torch.randn(int(starts[-1]), heads, HEAD_DIM, generator=gen)
    return (query, key_cache, value_cache, tables, torch.tensor(lens, dtype=torch.int32),
            starts.to(torch.int32), HEAD_DIM ** -0.5)


def operator(query, key_cache, value_cache, tables, lens, starts, scale, out=None):
    """torch.ops.folio.paged_attention, whichever build main() loaded (cpu_attention's own,
    or --library's: loading both would register the op twice)."""
    out = torch.empty_like(query) if out is None else out
    torch.ops.folio.paged_attention(out, query, key_cache, value_cache, tables, lens, starts,
                                    scale, 0, 0.0)
    return out


def best_ms(fn, reps: int, clock=time.perf_counter) -> float:
    fn()
    times = []
    for _ in range(reps):
        start = clock()
        fn()
        times.append((clock() - start) * 1e3)
    return min(times)   # the machine is shared: the least-disturbed run


def _load() -> str:
    return " ".join(f"{x:.2f}" for x in os.getloadavg())


def _loop_us(fn, calls: int, reps: int, clock) -> float:
    """The best of `reps` loops of `calls` calls, after an untimed one, in µs per call."""
    times = []
    for _ in range(reps + 1):
        start = clock()
        for _ in range(calls):
            fn()
        times.append((clock() - start) / calls)
    return min(times[1:]) * 1e6


STEP_BYTES = 96 * 2**20   # --decode step: caches cycled, past this machine's 32 MiB L3


def decode_table(args, clock) -> None:
    print(f"decode, {SMOL_HEADS}/{SMOL_KV_HEADS} heads, head_dim {HEAD_DIM}, {BLOCK}-token "
          f"blocks; us per call, median and best of {args.rounds} rounds; load {_load()}")
    print(f"{'dtype':<9} {'seqs':>4} {'context':>7} {'thr':>3} {'hot':>9} {'best':>9} "
          f"{'step':>9} {'best':>9} {'caches':>6}")
    for dtype in args.dtypes:
        for batch in args.batches:
            for context in args.contexts:
                query, key_cache, value_cache, tables, lens, starts, scale = make_case(
                    [(context - 1, 1)] * batch, heads=SMOL_HEADS, kv_heads=SMOL_KV_HEADS)
                query = query.to(getattr(torch, dtype))
                first = (key_cache.to(query.dtype), value_cache.to(query.dtype))
                layers = max(2, -(-STEP_BYTES // (2 * first[0].nbytes)))
                caches = [first] + [(k.clone(), v.clone()) for k, v in [first] * (layers - 1)]
                del key_cache, value_cache
                out = torch.empty_like(query)

                def call(kc, vc):
                    operator(query, kc, vc, tables, lens, starts, scale, out=out)

                def step():
                    for kc, vc in caches:
                        call(kc, vc)

                for threads in args.threads:
                    torch.set_num_threads(threads)
                    start = time.perf_counter()
                    call(*first)
                    # Loops of about 5 ms: µs-scale calls are timed many at a time.
                    calls = max(1, int(5e-3 / max(time.perf_counter() - start, 1e-6)))
                    hot = [_loop_us(lambda: call(*first), calls, args.reps, clock)
                           for _ in range(args.rounds)]
                    steps = [_loop_us(step, max(1, calls // layers), args.reps, clock) / layers
                             for _ in range(args.rounds)]
                    cells = " ".join(f"{statistics.median(t):9.2f} {min(t):9.2f}"
                                     for t in (hot, steps))
                    print(f"{dtype:<9} {batch:>4} {context:>7} {threads:>3} {cells} {layers:>6}",
                          flush=True)
    print(f"load after: {_load()}")


def tokens_per_gib(kv_cache_dtype: str, model_dtype: str = "float32") -> int:
    token_bytes = 2 * SMOL_LAYERS * SMOL_KV_HEADS * kv_row_bytes(kv_cache_dtype, model_dtype,
                                                                 HEAD_DIM)
    return 2**30 // token_bytes


def kv_cache_table(args, clock) -> None:
    query, key_cache, value_cache, tables, lens, starts, scale = make_case(
        [(args.context - 1, 1)] * args.batch, heads=SMOL_HEADS, kv_heads=SMOL_KV_HEADS)
    caches = {}
    for name in KV_TYPES:
        storage = kv_storage_dtype(name, torch.float32)
        caches[name] = (quantize_rows(key_cache, storage), quantize_rows(value_cache, storage))

    def call(name):
        return operator(query, *caches[name], tables, lens, starts, scale)

    exact = call("auto")
    print(f"decode {args.batch} x {args.context} tokens, {SMOL_HEADS}/{SMOL_KV_HEADS} heads, "
          f"head_dim {HEAD_DIM}; load {_load()}")
    print(f"{'kv cache':<10} {'thr':>3} {'ms':>7} {'vs f32':>7} {'err':>8} {'tok/GiB':>9}")
    for threads in args.threads:
        torch.set_num_threads(threads)
        times = {name: [] for name in KV_TYPES}
        for _ in range(args.rounds):
            for name in KV_TYPES:
                times[name].append(best_ms(lambda: call(name), args.reps, clock))
        base = statistics.median(times["auto"])
        for name in KV_TYPES:
            ms = statistics.median(times[name])
            err = float((call(name) - exact).abs().max() / exact.abs().max())
            label = "float32" if name == "auto" else name
            print(f"{label:<10} {threads:>3} {ms:7.3f} {base / ms:6.2f}x {err:8.4f} "
                  f"{tokens_per_gib(name):>9}")
    print(f"load after: {_load()}")


def operator_table(args, clock) -> None:
    gen = torch.Generator().manual_seed(1)
    lo, hi = args.decode_contexts
    decodes = [(int(n) - 1, 1) for n in torch.randint(lo, hi + 1, (64,), generator=gen)]
    cases = {f"decode 64 x {lo}-{hi}": decodes, "prompt 1 x 512": [(0, 512)],
             "mixed 64 dec + 512": decodes + [(0, 512)]}
    print(f"{'case':<20} {'thr':>3} {'plan':>7} {'ref':>8} {'op':>8} {'speedup':>8} {'max err':>8}")
    for threads in args.threads:
        torch.set_num_threads(threads)
        for label, seqs in cases.items():
            q, kc, vc, tables, lens, starts, scale = make_case(seqs, kv_heads=args.kv_heads)
            plan = reference.plan_attention(tables, lens, starts, BLOCK)
            plan_ms = best_ms(lambda: reference.plan_attention(tables, lens, starts, BLOCK),
                              args.reps, clock)
            ref_ms = best_ms(lambda: reference.paged_attention_planned(q, kc, vc, plan, scale),
                             args.reps, clock)
            out = torch.empty_like(q)
            op_ms = best_ms(lambda: operator(q, kc, vc, tables, lens, starts, scale, out=out),
                            args.reps, clock)
            error = (out - reference.paged_attention_planned(q, kc, vc, plan, scale)).abs().max()
            print(f"{label:<20} {threads:>3} {plan_ms:>7.2f} {ref_ms:>8.2f} {op_ms:>8.2f} "
                  f"{ref_ms / op_ms:>7.1f}x {float(error):>8.1e}")


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--reps", type=int, default=20)
    parser.add_argument("--threads", type=int, nargs="+", default=[1, 2])
    parser.add_argument("--decode-contexts", type=int, nargs=2, default=[16, 768],
                        metavar=("LO", "HI"), help="the 64 decodes' context range")
    parser.add_argument("--kv-heads", type=int, default=KV_HEADS,
                        help=f"KV heads under the {HEADS} query heads (default {KV_HEADS})")
    parser.add_argument("--clock", choices=("wall", "cpu"), default="wall",
                        help="cpu: process CPU time, which other jobs on a shared machine "
                             "disturb less (with 1 thread it is the latency; with more, "
                             "the sum over threads)")
    kv = parser.add_argument_group("--kv-cache: the decode over each KV cache type")
    kv.add_argument("--kv-cache", action="store_true")
    kv.add_argument("--rounds", type=int, default=5, help="rounds alternating the types")
    kv.add_argument("--batch", type=int, default=8, help="decode rows")
    kv.add_argument("--context", type=int, default=2048, help="tokens per row")
    dec = parser.add_argument_group("--decode: one decode step's calls, µs each")
    dec.add_argument("--decode", action="store_true")
    dec.add_argument("--batches", type=int, nargs="+", default=[1, 64], help="sequences")
    dec.add_argument("--contexts", type=int, nargs="+", default=[16, 256, 1024, 4096])
    dec.add_argument("--dtypes", nargs="+", choices=("float32", "bfloat16"),
                     default=["float32", "bfloat16"], help="query and cache dtype")
    parser.add_argument("--library", type=Path,
                        help="load this build of the operators instead (another commit's .so)")
    args = parser.parse_args(argv)
    clock = time.perf_counter if args.clock == "wall" else time.process_time
    if args.library:
        torch.ops.load_library(str(args.library))
    else:
        status = cpu_attention.load()
        if not status.ok:
            raise SystemExit(f"CPU operator unavailable: {status.detail}")
    table = decode_table if args.decode else kv_cache_table if args.kv_cache else operator_table
    table(args, clock)


if __name__ == "__main__":
    main()
