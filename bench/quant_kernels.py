"""Milliseconds per matmul of the quantized kernels, float activations
(kernels/cpu/quant_matmul.cpp) and int8 activations ("a8", kernels/cpu/quant_dot.cpp, up to 8
rows), against float32 oneDNN (PackedLinear), on SmolLM2-135M's shapes at several batch sizes:
which path is fastest where. Above 8 rows both int8 columns are the same float GEMM path.

    python -m bench.quant_kernels [--rows 1 8 64 512] [--repeat 3] [--threads 1]
"""

from __future__ import annotations

import argparse
import os
import time

import torch
from torch import nn

from folio.executor.linear import PackedLinear
from folio.kernels import cpu_attention
from folio.kernels.cpu_quant import (quant_matmul_int4, quant_matmul_int8, quantize_int4,
                                     quantize_int8)

# (N, K): SmolLM2-135M's o_proj, gate/up, down, k/v, lm_head
SHAPES = ((576, 576), (1536, 576), (576, 1536), (192, 576), (49152, 576))


def timed(fn, x, budget_s: float = 0.2) -> float:
    fn(x)
    calls, start = 0, time.perf_counter()
    while time.perf_counter() - start < budget_s or calls < 3:
        fn(x)
        calls += 1
    return (time.perf_counter() - start) / calls * 1e3


def paths(linear: nn.Linear) -> dict:
    w = linear.weight
    k = w.shape[1]
    q8c, s8c = quantize_int8(w, k)
    q8g, s8g = quantize_int8(w, 32)
    p4, s4, m4 = quantize_int4(w, 32)
    p4b, s4b, m4b = quantize_int4(w, 64)
    return {"float32 onednn": PackedLinear(linear),
            "int8 ch": lambda x: quant_matmul_int8(x, q8c, s8c),
            "int8 ch a8": lambda x: quant_matmul_int8(x, q8c, s8c, True),
            "int8 g32": lambda x: quant_matmul_int8(x, q8g, s8g),
            "int4 g32": lambda x: quant_matmul_int4(x, p4, s4, m4),
            "int4 g32 a8": lambda x: quant_matmul_int4(x, p4, s4, m4, True),
            "int4 g64": lambda x: quant_matmul_int4(x, p4b, s4b, m4b)}


@torch.inference_mode()
def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, nargs="+", default=[1, 8, 64, 512])
    parser.add_argument("--repeat", type=int, default=3, help="trials per cell; the best is kept")
    parser.add_argument("--threads", type=int, help="torch threads (default: torch's)")
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    status = cpu_attention.load()
    if not status.ok:
        raise SystemExit(f"the CPU operators are unavailable: {status.detail}")
    print(f"threads {torch.get_num_threads()}, load {os.getloadavg()[0]:.2f}")
    for n, k in SHAPES:
        linear = nn.Linear(k, n, bias=False)
        layers = paths(linear)
        for rows in args.rows:
            if n > 10000 and rows > 64:
                continue   # lm_head runs on the sampled rows only
            x = torch.randn(rows, k)
            best = {name: min(timed(fn, x) for _ in range(args.repeat))
                    for name, fn in layers.items()}
            cells = "  ".join(f"{name} {ms:7.3f}" for name, ms in best.items())
            print(f"{n:5d}x{k:<4d} M={rows:<3d} {cells}", flush=True)


if __name__ == "__main__":
    main()
