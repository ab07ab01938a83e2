"""bfloat16 against float32 on the CPU: speed and how far the greedy tokens drift.

    python bench/cpu_dtype.py [--rounds 2] [--num-requests 64]

Runs bench/throughput.py's workload through folio.LLM in float32 and in bfloat16, alternating
(A B A B) in one process, and prints tok/s per round with the load average, plus how many
requests' greedy tokens are identical in both and where the others first diverge.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.peer import compare_tokens                      # noqa: E402
from bench.throughput import build_model, run_folio, workload   # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--num-requests", type=int, default=64)
    parser.add_argument("--cpu-threads", type=int, default=None)
    parser.add_argument("--model-dir", type=Path, default=Path(".folio-cache/bench-llama-32m"))
    args = parser.parse_args()
    model = build_model(args.model_dir)
    prompts, outputs = workload(args.num_requests, 0)
    rounds, tokens = [], {}
    for index in range(args.rounds):
        for dtype in ("float32", "bfloat16"):
            run_args = argparse.Namespace(dtype=dtype, cpu_threads=args.cpu_threads,
                                          block_size=16, max_num_batched_tokens=2048,
                                          num_kv_blocks=None)
            load = os.getloadavg()[0]
            result = run_folio(model, prompts, outputs, run_args)
            tokens[dtype] = result["token_ids"]
            rounds.append({"round": index, "dtype": dtype, "tok_per_s": result["tok_per_s"],
                           "load_before": load, "load_after": os.getloadavg()[0]})
            print(f"round {index} {dtype:9s} {result['tok_per_s']:8.1f} tok/s  "
                  f"(load {load:.2f} -> {os.getloadavg()[0]:.2f})", flush=True)
    agreement = compare_tokens(tokens["float32"], tokens["bfloat16"])
    print(json.dumps({"rounds": rounds, "bfloat16_vs_float32": agreement}, indent=2))


if __name__ == "__main__":
    main()
