"""One linear layer, per batch size: float32 oneDNN (prepacked) against the int8 kernels.

    python bench/int8_kernels.py                     # SmolLM2-135M's shapes, 1..256 rows

Kernels: "f32" (executor/linear.py's PackedLinear), "prepacked" and "int_mm"
(executor/quantized_linear.py's Int8Linear kernels), and torch's weight-only
`_weight_int8pack_mm` ("int8pack", int8 weights, float activations). Prints the best of
five timings of a batch of calls, in microseconds per call, with the load average.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

# (out_features, in_features): qkv, o, gate_up, down, lm_head of SmolLM2-135M
SHAPES = [(960, 576), (576, 576), (3072, 576), (576, 1536), (49152, 576)]


def best_us(call, repeat: int) -> float:
    for _ in range(3):
        call()
    timings = []
    for _ in range(5):
        start = time.perf_counter()
        for _ in range(repeat):
            call()
        timings.append((time.perf_counter() - start) / repeat * 1e6)
    return min(timings)


def main() -> None:
    import torch
    from torch import nn

    from folio.executor.linear import PackedLinear
    from folio.executor.quantized_linear import Int8Linear, prepacked_available

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, nargs="+", default=[1, 8, 64, 256])
    parser.add_argument("--threads", type=int, default=None)
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    with torch.inference_mode():
        for out_features, in_features in SHAPES:
            linear = nn.Linear(in_features, out_features, bias=False)
            layers = {"f32": PackedLinear(linear), "int_mm": Int8Linear(linear, "int_mm")}
            if prepacked_available():
                layers["prepacked"] = Int8Linear(linear, "prepacked")
            q, scale = layers["int_mm"].weight, layers["int_mm"].scale
            for rows in args.rows:
                x = torch.randn(rows, in_features)
                repeat = max(2, int(2e7 // (out_features * in_features * max(rows, 8))))
                result = {"shape": [out_features, in_features], "rows": rows,
                          "load": round(os.getloadavg()[0], 2)}
                for name, layer in layers.items():
                    result[name] = round(best_us(lambda: layer(x), repeat), 1)
                result["int8pack"] = round(best_us(
                    lambda: torch.ops.aten._weight_int8pack_mm(x, q, scale), repeat), 1)
                print(json.dumps(result), flush=True)


if __name__ == "__main__":
    main()
