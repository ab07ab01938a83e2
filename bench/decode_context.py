"""What a lone request's decode pays for its context, served and in-process: one request at
a time of a short and a long prompt, alternated, and the time per output token of each.

    python bench/decode_context.py                       # the bench model, 128 and 1024
    python bench/decode_context.py --short 128 --long 2048 --pairs 8

Served: `folio serve` on a loopback port, the planner's own client (folio/planner/served.py),
0.5 s idle before each request. In-process: `folio.LLM`, each pair's TPOT as the difference
between a run of one output token and a run of `--output` tokens of a fresh prompt of the
same length. The planner's calibration grid must price context as a lone request pays it
(docs/planner.md, "Calibrating").
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))


def served(model: str, lengths: tuple[int, int], pairs: int, output: int,
           prompt) -> dict[int, list[float]]:
    from folio.planner.served import _Server, _stream_at

    server = _Server(model, {"num_kv_blocks": 1024})
    times: dict[int, list[float]] = {n: [] for n in lengths}
    try:
        server.wait_ready(600)
        _stream_at(server.port, [prompt(lengths[0]) for _ in range(4)], output, [0.0] * 4)
        for _ in range(pairs):
            for length in lengths:
                time.sleep(0.5)   # each request reaches an idle server, as at light load
                _, _, chunks = _stream_at(server.port, [prompt(length)], output, [0.0])
                times[length].append((chunks[0][-1] - chunks[0][0]) / (output - 1) * 1000)
    finally:
        server.stop()
    return times


def in_process(model: str, lengths: tuple[int, int], pairs: int, output: int,
               prompt) -> dict[int, list[float]]:
    import folio

    llm = folio.LLM(model, num_kv_blocks=1024)

    def run(length: int, tokens: int) -> float:
        params = folio.SamplingParams(max_tokens=tokens, ignore_eos=True, temperature=0)
        start = time.perf_counter()
        llm.generate([prompt(length)], params)
        return time.perf_counter() - start

    run(lengths[0], 8)   # first calls of the shape: allocations
    times: dict[int, list[float]] = {n: [] for n in lengths}
    for _ in range(pairs):
        for length in lengths:
            times[length].append((run(length, output) - run(length, 1)) / (output - 1) * 1000)
    return times


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default=None, help="default: the bench model")
    parser.add_argument("--short", type=int, default=128)
    parser.add_argument("--long", type=int, default=1024)
    parser.add_argument("--output", type=int, default=64)
    parser.add_argument("--pairs", type=int, default=6)
    args = parser.parse_args()
    from bench.serve_race import model_or_bench

    model = model_or_bench(args.model)
    vocab = json.loads((Path(model) / "config.json").read_text())["vocab_size"]
    rng = random.Random(1)

    def prompt(length: int) -> list[int]:   # random ids: no prefix hit
        return [rng.randrange(3, vocab) for _ in range(length)]

    lengths = (args.short, args.long)
    for name, measure in (("served", served), ("in-process", in_process)):
        times = measure(model, lengths, args.pairs, args.output, prompt)
        medians = {n: statistics.median(v) for n, v in times.items()}
        print(f"{name}: TPOT ms " + ", ".join(
            f"{n} prompt tokens {' '.join(f'{t:.2f}' for t in v)} (median {medians[n]:.2f})"
            for n, v in times.items())
            + f"; {args.long} against {args.short}: +{medians[args.long] - medians[args.short]:.2f}"
            " ms a token", flush=True)


if __name__ == "__main__":
    main()
