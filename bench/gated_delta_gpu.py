"""The delta rule's prompt on one CUDA GPU: the Triton kernel (kernels/triton_gated_delta.py
`delta_rule_prompt`, a per-(head, column block) recurrence) against the torch chunked form
(executor/models/hybrid/gated_delta.py `chunked`) that the other kernel sets run.

    python bench/gated_delta_gpu.py [--reps 10] [--json out.json] [--dry-run]

One request's fresh prompt of L = 64 .. 4096 tokens at Qwen3-Next / Qwen3.5's linear-attention
shape (32 value heads, k and v widths 128), bfloat16 values, float32 state. Each row: median
CUDA-event time of each (L2 flushed before each rep), the speed-up, tokens per second of the
kernel, and the largest difference of the outputs and the final state from the torch form's,
relative to its largest value. --dry-run: tiny shapes on CPU through triton's interpreter
(checks that this script runs; measures nothing).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path

SHAPES = {"qwen3-next": (32, 128, 128)}   # value heads, k width, v width
LENGTHS = (64, 512, 4096)
DRY_SHAPES = {"tiny": (2, 16, 40)}
DRY_LENGTHS = (1, 17)   # the interpreter runs a token at a time: short


@dataclass
class Row:
    shape: str
    tokens: int
    kernel_us: float
    torch_us: float
    speedup: float
    tokens_per_s: float
    out_rel_err: float
    state_rel_err: float


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--reps", type=int, default=10, help="timed reps per measurement")
    parser.add_argument("--json", metavar="PATH", help="also write every row as JSON here")
    parser.add_argument("--dry-run", action="store_true",
                        help="no GPU: tiny shapes on CPU through triton's interpreter")
    return parser.parse_args(argv)


def make_inputs(torch, heads, k_dim, v_dim, length, device, seed):
    gen = torch.Generator(device=device).manual_seed(seed)
    unit = lambda: torch.nn.functional.normalize(  # noqa: E731
        torch.randn(length, heads, k_dim, generator=gen, device=device), dim=-1)
    q, k = unit() * k_dim ** -0.5, unit()
    v = torch.randn(length, heads, v_dim, generator=gen, device=device).to(torch.bfloat16)
    g = -torch.rand(length, heads, generator=gen, device=device) * 0.1
    beta = torch.rand(length, heads, generator=gen, device=device)
    return q, k, v, g, beta


def relative(a, b) -> float:
    return ((a.float() - b.float()).abs().max() / b.float().abs().max().clamp_min(1e-12)).item()


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.dry_run:
        os.environ["TRITON_INTERPRET"] = "1"
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    import torch

    from bench.gpu_timer import Timer
    from folio.executor.models.hybrid.gated_delta import chunked
    from folio.kernels.triton_gated_delta import delta_rule_prompt

    device = "cpu" if args.dry_run else "cuda"
    if device == "cuda" and not torch.cuda.is_available():
        print("gated_delta_gpu: no CUDA device (use --dry-run to check the script on CPU)",
              file=sys.stderr)
        return 2
    began = time.monotonic()
    measure = Timer(torch, 1 if args.dry_run else args.reps, device)
    rows: list[Row] = []
    shapes = DRY_SHAPES if args.dry_run else SHAPES
    for name, (heads, k_dim, v_dim) in shapes.items():
        for length in DRY_LENGTHS if args.dry_run else LENGTHS:
            inputs = make_inputs(torch, heads, k_dim, v_dim, length, device, seed=length)
            pool = torch.zeros(2, heads, k_dim, v_dim, device=device)
            zeros = torch.zeros(heads, k_dim, v_dim, device=device)
            # Fresh each rep: every rep computes the same prompt from zeros.
            kernel_us = measure(lambda: delta_rule_prompt(*inputs, pool, 1, True))
            torch_us = measure(lambda: chunked(*inputs, zeros))
            out = delta_rule_prompt(*inputs, pool, 1, True)
            want_out, want_state = chunked(*inputs, zeros)
            row = Row(name, length, round(kernel_us, 1), round(torch_us, 1),
                      round(torch_us / kernel_us, 2), round(length / kernel_us * 1e6),
                      relative(out, want_out), relative(pool[1], want_state))
            rows.append(row)
            print(json.dumps(asdict(row)), flush=True)
    if args.json:
        Path(args.json).write_text(json.dumps([asdict(r) for r in rows], indent=1))
    worst = max(max(r.out_rel_err, r.state_rel_err) for r in rows)
    print(f"gated_delta_gpu: {len(rows)} rows, worst relative difference {worst:.2e}, "
          f"{time.monotonic() - began:.0f}s")
    return 0 if worst < 1e-3 else 1


if __name__ == "__main__":
    sys.exit(main())
