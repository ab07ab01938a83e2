"""CPU paged attention: the C++ operator against the torch reference path, per layer call.

    python -m bench.cpu_attention [--reps 20] [--threads 1 2] [--clock wall|cpu]

Cases: 64 decode rows with contexts drawn from 16-768 tokens, one 512-token prompt, and the
two mixed in one call (--decode-contexts changes the range); 8 query heads, 4 KV heads
(--kv-heads), head_dim 64, 16-token blocks in shuffled order, float32. `ref` is
reference.paged_attention_planned (the plan is built once per step and shared by every layer,
so it is timed apart: `plan`). Times: best of --reps, in ms.
"""

from __future__ import annotations

import argparse
import time

import torch

from folio.kernels import cpu_attention, reference

HEADS, KV_HEADS, HEAD_DIM, BLOCK = 8, 4, 64, 16


def make_case(seqs: list[tuple[int, int]], seed: int = 0, kv_heads: int = KV_HEADS):
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
    query = torch.randn(int(starts[-1]), HEADS, HEAD_DIM, generator=gen)
    return (query, key_cache, value_cache, tables, torch.tensor(lens, dtype=torch.int32),
            starts.to(torch.int32), HEAD_DIM ** -0.5)


def best_ms(fn, reps: int, clock=time.perf_counter) -> float:
    fn()
    times = []
    for _ in range(reps):
        start = clock()
        fn()
        times.append((clock() - start) * 1e3)
    return min(times)   # the machine is shared: the least-disturbed run


def main() -> None:
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
    args = parser.parse_args()
    clock = time.perf_counter if args.clock == "wall" else time.process_time
    status = cpu_attention.load()
    if not status.ok:
        raise SystemExit(f"CPU operator unavailable: {status.detail}")
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
            op_ms = best_ms(lambda: cpu_attention.paged_attention_cpu(
                q, kc, vc, tables, lens, starts, scale, out=out), args.reps, clock)
            error = (out - reference.paged_attention_planned(q, kc, vc, plan, scale)).abs().max()
            print(f"{label:<20} {threads:>3} {plan_ms:>7.2f} {ref_ms:>8.2f} {op_ms:>8.2f} "
                  f"{ref_ms / op_ms:>7.1f}x {float(error):>8.1e}")


if __name__ == "__main__":
    main()
