"""A crowd against the machine's arithmetic: the model's matmuls at full speed, and the
output tok/s that would allow.

    python bench/compute_ceiling.py --model-dir /tmp/smollm2-bf16 \\
        --measured "vLLM bfloat16=300" "Folio bfloat16=310" "Folio int8=335"

Peak: the model's own linear shapes (every layer's qkv, o, gate_up, down and the lm_head,
random weights) at --rows rows on all cores, through each path a crowd runs: Folio's BF16
kernel (kernels/cpu/bf16_gemm.cpp), oneDNN bfloat16 (what vLLM's CPU build calls), and int8
weights on the VNNI kernel (int8 activations). Best of --repeats passes; FLOP/s = 2 x rows x
the weights' values / seconds.

Work per output token of a served run of --prompt-len in / --output-len out: every prompt
and output token but the last goes through the layers' linears; each output token through
the lm_head; attention scores and values over the context each token sees (causal prompt,
then the growing context). The ceiling is peak / work: what a crowd would reach if the
matmuls ran at this speed and nothing else took time. `--measured NAME=TOKS` rows print the
share of the ceiling each reached (the bfloat16 ceiling for bfloat16 rows, int8's for int8).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import torch  # noqa: E402
from torch import nn  # noqa: E402


def shapes(config: dict) -> tuple[list[tuple[int, int]], tuple[int, int], int]:
    """(one layer's linears as (N, K), the lm_head's, layers)."""
    hidden, inter = config["hidden_size"], config["intermediate_size"]
    heads = config["num_attention_heads"]
    kv = config.get("num_key_value_heads", heads)
    head_dim = config.get("head_dim", hidden // heads)
    layer = [((heads + 2 * kv) * head_dim, hidden), (hidden, heads * head_dim),
             (2 * inter, hidden), (hidden, inter)]
    return layer, (config["vocab_size"], hidden), config["num_hidden_layers"]


def work_per_output_token(config: dict, prompt: int, output: int) -> float:
    layer, head, layers = shapes(config)
    per_token = 2 * layers * sum(n * k for n, k in layer)
    heads = config["num_attention_heads"]
    head_dim = config.get("head_dim", config["hidden_size"] // heads)
    attention = 0
    for position in range(prompt + output - 1):       # each token sees position + 1 keys
        attention += 4 * layers * heads * head_dim * (position + 1)
    total = (prompt + output - 1) * per_token + output * 2 * head[0] * head[1] + attention
    return total / output


def modules(path: str, config: dict) -> list[nn.Module]:
    from folio.executor.linear import PackedLinear, TiledBf16Linear
    from folio.executor.quantization.weight_only_linear import WeightOnlyLinear

    layer, head, _ = shapes(config)
    made = []
    for n, k in [*layer, head]:
        linear = nn.Linear(k, n, bias=False)
        if path == "Folio bfloat16":
            made.append(TiledBf16Linear(linear.bfloat16()))
        elif path == "oneDNN bfloat16":
            made.append(PackedLinear(linear.bfloat16()))
        else:
            made.append(WeightOnlyLinear.from_linear(linear, 8, True, int8_activations=True))
    return made


@torch.inference_mode()
def peak(path: str, config: dict, rows: int, repeats: int) -> float:
    layer, head, layers = shapes(config)
    dtype = torch.float32 if path.endswith("int8") else torch.bfloat16
    inputs = [torch.randn(rows, k, dtype=dtype) for _, k in [*layer, head]]
    made = modules(path, config)
    flops = 2 * rows * sum(n * k for n, k in [*layer, head])
    best = float("inf")
    for _ in range(repeats + 1):                      # the first pass warms up
        start = time.perf_counter()
        for module, x in zip(made, inputs):
            module(x)
        best = min(best, time.perf_counter() - start)
    return flops / best


def main() -> None:
    from folio.kernels import cpu_attention

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model-dir", required=True)
    parser.add_argument("--rows", type=int, default=256)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--prompt-len", type=int, default=256)
    parser.add_argument("--output-len", type=int, default=128)
    parser.add_argument("--measured", nargs="*", default=[], metavar="NAME=TOKS")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    if not cpu_attention.load().ok:
        sys.exit(f"the CPU operators are not built: {cpu_attention.load().detail}")
    load = os.getloadavg()
    config = json.loads((Path(args.model_dir) / "config.json").read_text())
    work = work_per_output_token(config, args.prompt_len, args.output_len)
    paths = {path: peak(path, config, args.rows, args.repeats)
             for path in ("Folio bfloat16", "oneDNN bfloat16", "Folio int8")}
    rows = []
    for entry in args.measured:
        name, _, value = entry.partition("=")
        ceiling = paths["Folio int8"] if "int8" in name else paths["Folio bfloat16"]
        rows.append({"name": name, "tok_s": float(value),
                     "share": float(value) * work / ceiling})
    if args.json:
        print(json.dumps({"load_average": load, "gflop_per_output_token": work / 1e9,
                          "peak_gflops": {k: v / 1e9 for k, v in paths.items()},
                          "measured": rows}))
        return
    print(f"load average {load[0]:.2f}; {torch.get_num_threads()} threads; {args.rows} rows; "
          f"{work / 1e9:.3f} GFLOP per output token ({args.prompt_len} in / "
          f"{args.output_len} out)")
    for path, flops in paths.items():
        print(f"  {path:<16} {flops / 1e9:7.1f} GFLOP/s  ceiling {flops / work:6.0f} output "
              "tok/s")
    for row in rows:
        print(f"  {row['name']:<24} {row['tok_s']:6.0f} tok/s = {row['share']:.0%} of its "
              "ceiling")


if __name__ == "__main__":
    main()
