"""How steady this machine's own speed is: one prompt step of the same shape, in-process
(`folio.LLM`, no server, nothing else of Folio's running), many times with a random idle
gap between, and the spread of its time.

    python bench/step_steadiness.py                 # the bench model, 150 steps
    python bench/step_steadiness.py --model DIR --runs 300 --prompt 512

A planner's prediction cannot be closer to a measurement than the machine repeats itself:
the planner's benchmark (bench/plan_check.py) reads its p50 errors beside this spread
(docs/planner.md, "How good is it"). CPU time over wall time tells a slow step that
computed slower (both threads busy, about 2 on 2 cores) from one that waited for a core.
"""

from __future__ import annotations

import argparse
import json
import random
import resource
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))


def cpu_s() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default=None, help="default: the bench model")
    parser.add_argument("--runs", type=int, default=150)
    parser.add_argument("--prompt", type=int, default=128, help="prompt tokens of the step")
    parser.add_argument("--idle-s", type=float, default=0.3,
                        help="each gap is drawn uniformly from 0 to this")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("-o", "--out", type=Path, default=None, help="write the times as JSON")
    args = parser.parse_args()
    import folio

    from bench.serve_race import model_or_bench
    model = model_or_bench(args.model)
    vocab = json.loads((Path(model) / "config.json").read_text())["vocab_size"]
    llm = folio.LLM(model, num_kv_blocks=256)
    one = folio.SamplingParams(max_tokens=1, ignore_eos=True, temperature=0)
    rng = random.Random(args.seed)

    def step() -> tuple[float, float]:
        prompt = [rng.randrange(3, vocab) for _ in range(args.prompt)]   # no prefix hit
        cpu, start = cpu_s(), time.perf_counter()
        llm.generate([prompt], one)
        wall = time.perf_counter() - start
        return wall * 1000, (cpu_s() - cpu) / wall

    for _ in range(5):   # first calls of the shape: allocations, not the machine
        step()
    runs = []
    for _ in range(args.runs):
        time.sleep(rng.uniform(0, args.idle_s))
        runs.append(step())
    times = [wall for wall, _ in runs]
    median = statistics.median(times)
    q = statistics.quantiles(times, n=20)
    slow = [busy for wall, busy in runs if wall > 1.3 * median]
    print(f"{args.prompt}-token prompt step, {args.runs} runs: min {min(times):.1f}, p5 "
          f"{q[0]:.1f}, p50 {median:.1f}, p95 {q[18]:.1f}, max {max(times):.1f} ms; "
          f"{len(slow)} over 1.3x the median"
          + (f", at {statistics.median(slow):.2f} cores busy" if slow else ""))
    print("in order:", " ".join(f"{t:.0f}" for t in times))
    if args.out:
        args.out.write_text(json.dumps({"model": model, "prompt": args.prompt,
                                        "runs": [{"ms": w, "cores_busy": b} for w, b in runs]},
                                       indent=1))


if __name__ == "__main__":
    main()
