"""MoE experts on CPU: ways to compute fused_moe's result, timed against each other.

    python -m bench.moe_cpu [--reps 20] [--threads 1 2] [--dtype float32] [--clock wall|cpu]
                            [--quick] [--variants ...]

Variants (each checked against the grouped reference before it is timed):
  dense     token by token, expert by expert: two F.linear on one row per (token, slot)
  grouped   kernels.moe_reference.fused_moe_ref: pairs sorted by expert, one F.linear pair
            per expert with tokens, index_add back
  onednn    grouped, with each expert's weights prepacked for oneDNN once (as
            executor/linear.py does for the dense layers) and mkldnn._linear_pointwise
            (kernels.moe_cpu.CpuFusedMoe packing every expert size)
  bmm       grouped into a zero-padded [E_used, max_n, H] batch: one torch.bmm per projection
            over the experts that have tokens (their weights gathered each call)
  all       every expert on every token (two bmm over all E), then the k results picked
  cpu       what the cpu kernel set runs: CpuFusedMoe's defaults (oneDNN for experts of at
            least 128K weights in w13[e] when there is more than one token, else grouped)
Shapes: `tiny` (what the tests' checkpoints look like), `mixtral-ish` (8 experts, top-2) and
`qwen3moe-ish` (64 small experts, top-8); T = 1, 8, 64 (decode batches) and 512 (a prompt).
Times: best of --reps, in ms per layer call (the machine is shared: best-of is the steady one).
"""

from __future__ import annotations

import argparse
import os
import time
from typing import Any, Callable

import torch
import torch.nn.functional as F

from folio.kernels.moe_cpu import CpuFusedMoe
from folio.kernels.moe_reference import fused_moe_ref, sort_by_expert

SHAPES = {  # name: (hidden, intermediate, experts, top_k)
    "tiny": (128, 256, 8, 2),
    "mixtral-ish": (768, 2048, 8, 2),
    "qwen3moe-ish": (768, 256, 64, 8),
}
TOKENS = (1, 8, 64, 512)


def dense(x, w13, w2, weights, ids):
    inter = w2.shape[2]
    out = torch.zeros(x.shape, dtype=torch.float32)
    for t in range(x.shape[0]):
        for j in range(ids.shape[1]):
            e = int(ids[t, j])
            gate_up = F.linear(x[t:t + 1], w13[e])
            down = F.linear(F.silu(gate_up[:, :inter]) * gate_up[:, inter:], w2[e])
            out[t] += float(weights[t, j]) * down[0].float()
    return out.to(x.dtype)


def grouped(x, w13, w2, weights, ids):
    return fused_moe_ref(x, w13, w2, weights, ids)


def bmm(x, w13, w2, weights, ids):
    inter, top_k = w2.shape[2], ids.shape[1]
    order, counts = sort_by_expert(ids, w13.shape[0])
    used = [e for e, c in enumerate(counts) if c]
    widest = max(counts)
    token_of_pair = order // top_k
    # slot of each sorted pair in the padded batch: (its expert's index among the used, rank)
    slots = torch.cat([torch.arange(i * widest, i * widest + counts[e])
                       for i, e in enumerate(used)])
    batch = x.new_zeros(len(used) * widest, x.shape[1])
    batch[slots] = x[token_of_pair]
    experts = torch.tensor(used)
    gate_up = torch.bmm(batch.view(len(used), widest, -1), w13[experts].transpose(1, 2))
    act = F.silu(gate_up[..., :inter]) * gate_up[..., inter:]
    down = torch.bmm(act, w2[experts].transpose(1, 2)).reshape(-1, x.shape[1])[slots]
    out = torch.zeros(x.shape, dtype=torch.float32)
    out.index_add_(0, token_of_pair,
                   down.float() * weights.reshape(-1).float()[order][:, None])
    return out.to(x.dtype)


def all_experts(x, w13, w2, weights, ids):
    inter = w2.shape[2]
    gate_up = torch.matmul(x, w13.transpose(1, 2))                 # [E, T, 2I]
    act = F.silu(gate_up[..., :inter]) * gate_up[..., inter:]
    down = torch.bmm(act, w2.transpose(1, 2))                      # [E, T, H]
    picked = down[ids, torch.arange(x.shape[0])[:, None]]          # [T, k, H]
    return (picked.float() * weights.float()[..., None]).sum(1).to(x.dtype)


def variants() -> dict[str, Callable[..., torch.Tensor]]:
    """name -> fn(x, w13, w2, weights, ids); the CpuFusedMoe ones pack on their first call."""
    return {"dense": dense, "grouped": grouped, "onednn": CpuFusedMoe(min_pack_elements=0),
            "bmm": bmm, "all": all_experts, "cpu": CpuFusedMoe()}


VARIANT_NAMES = ("dense", "grouped", "onednn", "bmm", "all", "cpu")


def best_ms(fn: Callable[[], Any], reps: int, clock: Callable[[], float]) -> float:
    fn()
    best = float("inf")
    for _ in range(reps):
        began = clock()
        fn()
        best = min(best, clock() - began)
    return best * 1e3


def make_case(shape, tokens, dtype, seed):
    hidden, inter, experts, top_k = shape
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(tokens, hidden, generator=gen).to(dtype)
    w13 = (torch.randn(experts, 2 * inter, hidden, generator=gen) / hidden ** 0.5).to(dtype)
    w2 = (torch.randn(experts, hidden, inter, generator=gen) / inter ** 0.5).to(dtype)
    weights, ids = torch.topk(torch.randn(tokens, experts, generator=gen).softmax(-1), top_k)
    return x, w13, w2, weights, ids


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--reps", type=int, default=20)
    parser.add_argument("--threads", type=int, nargs="+", default=[1])
    parser.add_argument("--dtype", choices=("float32", "bfloat16"), default="float32")
    parser.add_argument("--clock", choices=("wall", "cpu"), default="wall",
                        help="cpu: process CPU time, steadier on a shared machine (one thread)")
    parser.add_argument("--quick", action="store_true",
                        help="the tiny shape at T = 1 and 64, 2 reps (checks the script runs)")
    parser.add_argument("--variants", nargs="+", choices=VARIANT_NAMES,
                        default=list(VARIANT_NAMES))
    args = parser.parse_args(argv)
    if args.reps < 1 or any(t < 1 for t in args.threads):
        parser.error("--reps and --threads must be >= 1")
    dtype = getattr(torch, args.dtype)
    clock = time.perf_counter if args.clock == "wall" else time.process_time
    shapes = {"tiny": SHAPES["tiny"]} if args.quick else SHAPES
    tokens_list = (1, 64) if args.quick else TOKENS
    reps = 2 if args.quick else args.reps
    print(f"# load average {' '.join(f'{v:.2f}' for v in os.getloadavg())}, {args.dtype}, "
          f"best of {reps}, ms per call ({args.clock} clock)")
    print(f"{'shape':<14}{'T':>5}{'thr':>4}" + "".join(f"{v:>10}" for v in args.variants)
          + "   fastest")
    for threads in args.threads:
        torch.set_num_threads(threads)
        for (name, shape), tokens in [(s, t) for s in shapes.items() for t in tokens_list]:
            x, w13, w2, weights, ids = make_case(shape, tokens, dtype, seed=tokens)
            expected = fused_moe_ref(x, w13, w2, weights, ids).float()
            scale = expected.abs().max().item()
            times = {}
            fns = variants()          # fresh packed copies for each case's weights
            for variant in args.variants:
                fn = fns[variant]
                got = fn(x, w13, w2, weights, ids).float()
                error = (got - expected).abs().max().item() / scale
                if error > (1e-5 if dtype == torch.float32 else 2e-2):
                    raise SystemExit(f"{variant} disagrees with the reference on {name} "
                                     f"T={tokens}: relative error {error:.2e}")
                if variant == "dense" and tokens > 64:
                    times[variant] = float("nan")      # minutes of Python loop: not worth it
                    continue
                times[variant] = best_ms(lambda: fn(x, w13, w2, weights, ids), reps, clock)
            fastest = min((t, v) for v, t in times.items() if t == t)[1]
            print(f"{name:<14}{tokens:>5}{threads:>4}"
                  + "".join(f"{times[v]:>10.3f}" for v in args.variants) + f"   {fastest}",
                  flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
