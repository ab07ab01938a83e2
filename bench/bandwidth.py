"""One-user decode against the memory's limit: the machine's bandwidth, each format's bytes
per token, the floor they make and the share of it a step reaches.

    python bench/bandwidth.py --model-dir /tmp/smollm2-bf16 --paths bfloat16 int8 int4 \\
        /path/to/model.q8_0.gguf

Bandwidth: a STREAM-like pass on the executor's threads (all cores unless --threads), over
arrays far larger than any cache: `read` sums 1 GiB of float32 (what a decode step does with
its weights), `copy` copies it (read and write both counted, as STREAM does). Best of
--repeats.

Per path (each in a fresh process, offline `folio.LLM`, CPU): the weights' bytes a decode
step reads (executor/weight_bytes.py, what `folio:weight_bytes_per_step` reports), the floor
bytes / read bandwidth, and one request's decode (a --prompt-len prompt of random ids, then
--tokens greedy tokens, EOS ignored): the median step time of the decode steps and the
share floor / step. A path is `float32`, `bfloat16` (the checkpoint in that dtype), `int8`,
`int4` (`--quantization`, float32 activations elsewhere) or a `.gguf` file.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))


def stream(threads: int, repeats: int) -> dict[str, float]:
    import torch

    torch.set_num_threads(threads)
    source = torch.ones(2**28)            # 1 GiB of float32
    target = torch.empty_like(source)
    read = copy = float("inf")
    for _ in range(repeats):
        start = time.perf_counter()
        source.sum()
        read = min(read, time.perf_counter() - start)
        start = time.perf_counter()
        target.copy_(source)
        copy = min(copy, time.perf_counter() - start)
    size = source.numel() * source.element_size()
    return {"threads": threads, "read_gbps": size / read / 1e9, "copy_gbps": 2 * size / copy / 1e9}


def load(path: str, model_dir: str | None):
    from folio import LLM

    common = dict(skip_tokenizer_init=True, device="cpu", num_kv_blocks=256)
    if path.endswith(".gguf"):
        return LLM(path, **common)
    if path in ("float32", "bfloat16"):
        return LLM(model_dir, dtype=path, **common)
    return LLM(model_dir, dtype="float32", quantization=path, **common)


def decode(path: str, model_dir: str | None, prompt_len: int, tokens: int) -> dict:
    from folio import SamplingParams
    from folio.executor.weight_bytes import weight_bytes_per_step

    llm = load(path, model_dir)
    engine = llm.engine
    rng = random.Random(0)
    vocab = engine.executor.model_config.vocab_size
    steps = []
    for run in range(2):                 # the first warms up
        engine.add_request(f"r{run}", [rng.randrange(1, vocab) for _ in range(prompt_len)],
                           SamplingParams(temperature=0, max_tokens=tokens, ignore_eos=True))
        engine.step()                    # the prompt
        while engine.has_unfinished_requests():
            start = time.perf_counter()
            engine.step()
            steps.append(time.perf_counter() - start)
        steps = steps if run else []
    return {"path": path, "weight_bytes": weight_bytes_per_step(engine.executor.model),
            "step_ms": statistics.median(steps) * 1e3}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model-dir", help="the checkpoint for float32/bfloat16/int8/int4")
    parser.add_argument("--paths", nargs="+", default=["bfloat16", "int8"])
    parser.add_argument("--threads", type=int, default=os.cpu_count())
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--prompt-len", type=int, default=16)
    parser.add_argument("--tokens", type=int, default=128)
    parser.add_argument("--json", action="store_true")
    parser.add_argument("--worker", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        print(json.dumps(decode(args.worker, args.model_dir, args.prompt_len, args.tokens)))
        return
    print(f"load average at start: {' '.join(f'{x:.2f}' for x in os.getloadavg())}")
    memory = stream(args.threads, args.repeats)
    print(f"bandwidth on {args.threads} threads: read {memory['read_gbps']:.1f} GB/s, "
          f"copy {memory['copy_gbps']:.1f} GB/s")
    rows = []
    for path in args.paths:
        command = [sys.executable, __file__, "--worker", path, "--prompt-len",
                   str(args.prompt_len), "--tokens", str(args.tokens)]
        if args.model_dir:
            command += ["--model-dir", args.model_dir]
        done = subprocess.run(command, capture_output=True, text=True, check=True)
        row = json.loads(done.stdout.strip().splitlines()[-1])
        row["floor_ms"] = row["weight_bytes"] / memory["read_gbps"] / 1e6
        row["share_of_floor"] = row["floor_ms"] / row["step_ms"]
        rows.append(row)
    if args.json:
        print(json.dumps({"bandwidth": memory, "paths": rows}))
        return
    print(f"{'path':<40} {'MB/token':>9} {'floor ms':>9} {'step ms':>8} {'share':>6}")
    for row in rows:
        print(f"{Path(row['path']).name:<40} {row['weight_bytes'] / 1e6:>9.1f} "
              f"{row['floor_ms']:>9.2f} {row['step_ms']:>8.2f} {row['share_of_floor']:>6.0%}")


if __name__ == "__main__":
    main()
