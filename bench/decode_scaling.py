"""Decode step time against the running batch, in process: what half a batch per replica
costs each token (data-parallel replicas split one batch between them).

    taskset -c 0 python bench/decode_scaling.py --model DIR --batches 1 16 32 64 --threads 1

Each batch size runs its own requests (prompts of --prompt-len random ids, greedy, EOS
ignored) to --steps all-decode steps; reports the median step time, tokens/s, and the
fixed cost per step a straight line through the sizes gives (the weights are read once a
step, whatever the batch).
"""

from __future__ import annotations

import argparse
import random
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))


def decode_ms(engine, batch: int, prompt_len: int, steps: int, vocab: int, tag: str) -> float:
    from folio import SamplingParams

    rng = random.Random(batch)
    ids = [f"{tag}-{i}" for i in range(batch)]
    # The first prompts decode while the last are still prefilled: room for those steps too.
    prefill_steps = -(-batch * prompt_len // engine.scheduler.config.max_num_batched_tokens)
    params = SamplingParams(temperature=0, max_tokens=steps + prefill_steps + 8, ignore_eos=True)
    for request_id in ids:
        engine.add_request(request_id, [rng.randrange(1, vocab) for _ in range(prompt_len)],
                           params)
    times: list[float] = []
    while len(times) < steps:
        plan = engine.scheduler.schedule()
        start = time.perf_counter()
        result = engine.executor.execute(plan)
        elapsed = time.perf_counter() - start
        engine.scheduler.update(plan, result)
        if not plan.new_requests and len(plan.running_handles) == batch:
            times.append(elapsed)
        elif not plan.new_requests and not plan.running_handles:   # all ended: never loop
            raise SystemExit(f"batch {batch}: the requests ended after {len(times)} of the "
                             f"{steps} decode steps with all of them running (does the KV "
                             "cache hold batch x prompt length?)")
    for request_id in ids:
        engine.abort_request(request_id)
    return statistics.median(times) * 1e3


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", required=True)
    parser.add_argument("--batches", type=int, nargs="+", default=[1, 16, 32, 64])
    parser.add_argument("--rounds", type=int, default=2, help="each size this many times")
    parser.add_argument("--prompt-len", type=int, default=256)
    parser.add_argument("--steps", type=int, default=60)
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args(argv)

    import torch

    from folio import LLM

    torch.set_num_threads(args.threads)
    llm = LLM(args.model, skip_tokenizer_init=True, dtype="float32")
    vocab = llm.engine.executor.capacity.vocab_size
    medians: dict[int, list[float]] = {b: [] for b in args.batches}
    for round_ in range(args.rounds):
        for batch in args.batches:
            ms = decode_ms(llm.engine, batch, args.prompt_len, args.steps, vocab,
                           f"r{round_}b{batch}")
            medians[batch].append(ms)
            print(f"round {round_} batch {batch}: {ms:.1f} ms/step, {batch / ms * 1e3:.0f} "
                  "tok/s", flush=True)
    best = {b: min(v) for b, v in medians.items()}
    if len(best) >= 2:
        xs, ys = list(best), list(best.values())
        mean_x, mean_y = statistics.fmean(xs), statistics.fmean(ys)
        slope = (sum((x - mean_x) * (y - mean_y) for x, y in zip(xs, ys))
                 / sum((x - mean_x) ** 2 for x in xs))
        print(f"best of rounds, fitted: {mean_y - slope * mean_x:.1f} ms per step + "
              f"{slope:.2f} ms per running request")


if __name__ == "__main__":
    main()
