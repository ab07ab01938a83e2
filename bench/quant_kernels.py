"""Milliseconds per matmul of the quantized kernels, float activations
(kernels/cpu/quant_matmul.cpp) and int8 activations ("a8", kernels/cpu/quant_dot.cpp, up to 8
rows), against float32 oneDNN (PackedLinear), on SmolLM2-135M's shapes at several batch sizes:
which path is fastest where. Above 8 rows both int8 columns are the same float GEMM path.

    python -m bench.quant_kernels [--rows 1 8 64 512] [--repeat 3] [--threads 1]
    python -m bench.quant_kernels --model-pass [--rows 1 4 8] [--threads 2]

--model-pass times one pass through every linear layer of SmolLM2-135M (30 x qkv, o,
gate_up, down, then lm_head; random weights, 134 MB as int8), which, unlike one layer timed
again and again, reads its weights from memory rather than cache, as a decode step does.
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


# One decoder layer's fused linears of SmolLM2-135M (qkv, o, gate_up, down), 30 layers.
LAYER_SHAPES = ((960, 576), (576, 576), (3072, 576), (576, 1536))


def model_pass(rows_list: list[int], repeat: int) -> None:
    torch.manual_seed(0)
    shapes = LAYER_SHAPES * 30
    int8 = [quantize_int8(torch.randn(n, k) * 0.05, k) for n, k in shapes]
    int4 = [quantize_int4(torch.randn(n, k) * 0.05, 32) for n, k in shapes]
    head = quantize_int8(torch.randn(49152, 576) * 0.05, 576)
    for rows in rows_list:
        x = {k: torch.randn(rows, k) for k in (576, 1536)}
        cells = []
        for bits, layers in ((8, int8), (4, int4)):
            for a8 in (False, True):
                def once() -> None:
                    for weight in layers:
                        k = weight[0].shape[1] * (1 if bits == 8 else 2)
                        (quant_matmul_int8 if bits == 8 else quant_matmul_int4)(x[k], *weight, a8)
                    quant_matmul_int8(x[576], *head, a8)
                once()
                best = min(timed(lambda _: once(), None, 0.0) for _ in range(repeat))
                cells.append(f"int{bits}{' a8' if a8 else ''} {best:7.2f}")
        print(f"model pass M={rows:<2d} " + "  ".join(cells), flush=True)


@torch.inference_mode()
def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, nargs="+", default=[1, 8, 64, 512])
    parser.add_argument("--repeat", type=int, default=3, help="trials per cell; the best is kept")
    parser.add_argument("--threads", type=int, help="torch threads (default: torch's)")
    parser.add_argument("--model-pass", action="store_true",
                        help="time passes through all of SmolLM2-135M's linears instead")
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    status = cpu_attention.load()
    if not status.ok:
        raise SystemExit(f"the CPU operators are unavailable: {status.detail}")
    print(f"threads {torch.get_num_threads()}, load {os.getloadavg()[0]:.2f}")
    if args.model_pass:
        model_pass(args.rows, args.repeat)
        return
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
