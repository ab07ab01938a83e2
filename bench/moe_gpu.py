"""fused_moe timings on one CUDA GPU: the Triton kernel against the grouped torch path.

    python bench/moe_gpu.py [--quick] [--budget-s 90] [--json out.json] [--dry-run]

Shapes of two checkpoints people serve: Mixtral-8x7B (H 4096, I 14336, 8 experts, top-2) and
Qwen3-30B-A3B (H 2048, I 768, 128 experts, top-8), bf16, T = 1 .. 4096 tokens with random
routing. Each row: median CUDA-event time of the kernel and of kernels.moe_reference (L2
flushed before each rep), the speed-up, the largest error relative to the reference's largest
value, the bandwidth over the experts' weights that were used (what bounds decode) and TFLOP/s
(what bounds prefill). Then, while --budget-s lasts, a coordinate search over launch configs
for the T = 1 and T = 512 cases (one parameter at a time from the default).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

SHAPES = {  # name: (hidden, intermediate, experts, top_k)
    "mixtral-8x7b": (4096, 14336, 8, 2),
    "qwen3-30b-a3b": (2048, 768, 128, 8),
}
TOKENS = (1, 8, 64, 512, 4096)
DRY_SHAPES = {"tiny": (32, 32, 4, 2)}
DRY_TOKENS = (1, 9)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="T = 1 and 64 only, no sweep")
    parser.add_argument("--budget-s", type=float, default=90.0,
                        help="stop sweeping once this many seconds have passed (default 90)")
    parser.add_argument("--reps", type=int, default=20, help="timed reps per measurement")
    parser.add_argument("--json", metavar="PATH", help="also write every row as JSON here")
    parser.add_argument("--dry-run", action="store_true",
                        help="no GPU: tiny shapes on CPU through triton's interpreter, wall-clock "
                             "times, a 3 s sweep (checks that this script runs, measures nothing)")
    return parser.parse_args(argv)


@dataclass
class Row:
    kind: str              # case | sweep
    shape: str
    tokens: int
    config: str
    kernel_us: float
    torch_us: float | None
    speedup: float | None
    max_rel_err: float
    weight_gbps: float
    tflops: float


def make_weights(torch, shape, dtype, device, seed):
    hidden, inter, experts, _ = shape
    gen = torch.Generator(device=device).manual_seed(seed)
    w13 = torch.randn(experts, 2 * inter, hidden, generator=gen, device=device, dtype=dtype)
    w2 = torch.randn(experts, hidden, inter, generator=gen, device=device, dtype=dtype)
    return w13.mul_(hidden ** -0.5), w2.mul_(inter ** -0.5)


def make_routing(torch, shape, tokens, dtype, device, seed):
    hidden, _, experts, top_k = shape
    gen = torch.Generator(device=device).manual_seed(seed)
    x = torch.randn(tokens, hidden, generator=gen, device=device).to(dtype)
    logits = torch.randn(tokens, experts, generator=gen, device=device)
    weights, ids = torch.topk(logits.softmax(-1), top_k)
    return x, weights, ids


def costs(shape, ids, element_size) -> tuple[float, float]:
    """(bytes of the used experts' weights, flops) of one call."""
    hidden, inter, _, _ = shape
    used = int(ids.unique().numel())
    return used * 3 * hidden * inter * element_size, ids.numel() * 6.0 * hidden * inter


def coordinate_search(measure_config, start, budget_end: float):
    """Best (us, config) found by changing one launch parameter at a time from `start`,
    keeping each improvement, until `budget_end` (time.monotonic())."""
    choices = {"block_m": (16, 32, 64, 128), "block_n": (32, 64, 128, 256),
               "block_k": (32, 64, 128), "num_warps": (2, 4, 8), "num_stages": (2, 3, 4, 5)}
    best = (measure_config(start), start)
    for field_name, values in choices.items():
        for value in values:
            if time.monotonic() > budget_end:
                return best
            config = dataclasses.replace(best[1], **{field_name: value})
            if config == best[1]:
                continue
            us = measure_config(config)
            if us is not None and (best[0] is None or us < best[0]):
                best = (us, config)
    return best


@dataclass
class Case:
    shape_name: str
    shape: tuple[int, int, int, int]
    tokens: int
    inputs: tuple[Any, ...]
    expected: Any
    nbytes: float
    flops: float


def make_row(kernels_module, case: Case, kind: str, config, kernel_us: float,
             torch_us: float | None) -> Row:
    out = kernels_module.fused_moe(*case.inputs, config=config).float()
    scale = case.expected.abs().max().item() or 1.0
    return Row(kind, case.shape_name, case.tokens, str(config or "default"), round(kernel_us, 2),
               None if torch_us is None else round(torch_us, 2),
               None if torch_us is None else round(torch_us / kernel_us, 2),
               (out - case.expected).abs().max().item() / scale,
               round(case.nbytes / kernel_us / 1e3, 1), round(case.flops / kernel_us / 1e6, 2))


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.dry_run:
        os.environ["TRITON_INTERPRET"] = "1"
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    import torch

    from bench.gpu_timer import Timer
    from folio import kernels
    from folio.kernels.moe_reference import fused_moe_ref

    device = "cpu" if args.dry_run else "cuda"
    if device == "cuda" and not torch.cuda.is_available():
        print("moe_gpu: no CUDA device (use --dry-run to check the script on CPU)",
              file=sys.stderr)
        return 2
    began = time.monotonic()
    shapes = DRY_SHAPES if args.dry_run else SHAPES
    token_counts = DRY_TOKENS if args.dry_run else ((1, 64) if args.quick else TOKENS)
    measure = Timer(torch, 2 if args.dry_run else args.reps, device)
    dtype = torch.float32 if args.dry_run else torch.bfloat16
    rows: list[Row] = []

    def emit(row: Row) -> None:
        rows.append(row)
        print(json.dumps(asdict(row)), flush=True)

    cases: list[tuple[Case, float]] = []
    for seed, (name, shape) in enumerate(shapes.items()):
        w13, w2 = make_weights(torch, shape, dtype, device, seed)
        for tokens in token_counts:
            x, weights, ids = make_routing(torch, shape, tokens, dtype, device, seed + tokens)
            inputs = (x, w13, w2, weights, ids)
            case = Case(name, shape, tokens, inputs, fused_moe_ref(*inputs).float(),
                        *costs(shape, ids, x.element_size()))
            kernel_us = measure(lambda: kernels.fused_moe(*inputs))
            torch_us = measure(lambda: fused_moe_ref(*inputs))
            emit(make_row(kernels, case, "case", None, kernel_us, torch_us))
            cases.append((case, kernel_us))
    if not args.quick:
        from folio.kernels.triton_moe import MoEConfig, default_block_m

        def measure_config(case: Case, config) -> float | None:
            try:
                return measure(lambda: kernels.fused_moe(*case.inputs, config=config))
            except Exception as exc:  # noqa: BLE001 -- e.g. out of shared memory: skip it
                print(f"sweep: {config} failed: {type(exc).__name__}: {exc}"[:200], flush=True)
                return None

        if args.dry_run:     # a few candidates, to run the search's code
            args.budget_s = time.monotonic() - began + 3.0
        # Decode and prompt cases of each shape, an even share of the budget left for each.
        swept = [(case, us) for case, us in cases if case.tokens in (1, 512)]
        for index, (case, default_us) in enumerate(swept):
            left = args.budget_s - (time.monotonic() - began)
            budget_end = time.monotonic() + left / (len(swept) - index)
            _, _, experts, top_k = case.shape
            start = MoEConfig(default_block_m(case.tokens * top_k / experts), 64, 64, 4, 3)
            best_us, best = coordinate_search(lambda c: measure_config(case, c), start,
                                              budget_end)
            if best_us is not None:    # the best found; speedup is over the default config
                row = make_row(kernels, case, "sweep", best, best_us, None)
                emit(dataclasses.replace(row, speedup=round(default_us / best_us, 2)))
    if args.json:
        Path(args.json).write_text(json.dumps([asdict(r) for r in rows], indent=1))
    worst = max(r.max_rel_err for r in rows)
    print(f"moe_gpu: {len(rows)} rows, worst relative error {worst:.2e}, "
          f"{time.monotonic() - began:.0f}s")
    return 0 if worst < 2e-2 else 1


if __name__ == "__main__":
    sys.exit(main())
