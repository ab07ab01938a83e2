"""One request at a time through `folio serve`, timed inside it: for each request of a
bench/plan_check.py workload, when the client sent it, when the scheduler process added it,
when the step holding its prompt was planned, how long the executor ran that step, and its
first token at the client; beside the planner's replay of the same requests.

    python bench/serve_timeline.py bursty 2 --cost plan-cost.json
    python bench/serve_timeline.py long 0.5 --cost plan-cost.json

The server's processes load serve_timeline_hooks/sitecustomize.py (first on their
PYTHONPATH), which writes their events with CLOCK_MONOTONIC times, the clock this client's
time.monotonic() reads. Made to see where a plan and a served run part (docs/planner.md).
"""

from __future__ import annotations

import argparse
import asyncio
import glob
import json
import os
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench import serve_client, serve_process  # noqa: E402
from bench.plan_check import WORKLOADS, arrivals  # noqa: E402


async def send_all(base_url: str, prompts: list[list[int]], times: list[float],
                   output: int) -> tuple[float, list[dict]]:
    """Each prompt at its arrival time (s from the start): (the start, each result with
    its send time)."""
    import aiohttp

    async with aiohttp.ClientSession(trust_env=False, read_bufsize=2**20) as session:
        async with session.get(f"{base_url}/v1/models") as response:
            model = (await response.json())["data"][0]["id"]

        async def one(prompt: list[int]) -> dict:
            body = {"model": model, "prompt": prompt, "max_tokens": output, "temperature": 0,
                    "ignore_eos": True, "stream": True,
                    "stream_options": {"include_usage": True}}
            sent = time.monotonic()
            result = await serve_client.one_request(session, f"{base_url}/v1/completions",
                                                    body, 600)
            return {**result, "sent": sent}

        begin = time.monotonic()
        tasks = []
        for prompt, at in zip(prompts, times):
            await asyncio.sleep(max(0.0, begin + at - time.monotonic()))
            tasks.append(asyncio.create_task(one(prompt)))
        return begin, await asyncio.gather(*tasks)


def read_events(base: str) -> tuple[list[list[str]], dict[int, list[str]], dict[int, float],
                                    dict[int, tuple[float, float]]]:
    """(adds in order, plans by step, results by step, executor runs by step)."""
    lines = [line.split() for name in glob.glob(base + ".*") for line in open(name)]
    adds = sorted((f for f in lines if f[0] == "add"), key=lambda f: float(f[1]))
    plans = {int(f[2]): f for f in lines if f[0] == "plan"}
    results = {int(f[2]): float(f[1]) for f in lines if f[0] == "result"}
    runs = {int(f[3]): (float(f[1]), float(f[2])) for f in lines if f[0] == "exec"}
    return adds, plans, results, runs


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("workload", choices=sorted(WORKLOADS))
    parser.add_argument("rate", type=float)
    parser.add_argument("--cost", type=Path, required=True, help="a `folio plan calibrate` file")
    parser.add_argument("--model", default=None, help="default: the bench model")
    parser.add_argument("--num-prompts", type=int, default=24)
    parser.add_argument("--output-len", type=int, default=32)
    parser.add_argument("--seed", type=int, default=100,
                        help="as bench/plan_check.py's: the same arrivals")
    args = parser.parse_args()
    from folio.planner.cost import load_cost
    from folio.planner.replay import predict
    from folio.planner.simulator.inputs import TraceRequest

    from bench.serve_race import model_or_bench
    model = model_or_bench(args.model, ROOT / ".folio-cache")
    _, input_len, burstiness = WORKLOADS[args.workload]
    number = [(n, r) for n in WORKLOADS for r in WORKLOADS[n][0]].index(
        (args.workload, args.rate))   # plan_check's order, so its seeds and arrivals
    times = arrivals(args.num_prompts, args.rate, args.seed + number, burstiness)
    vocab = json.loads((Path(model) / "config.json").read_text())["vocab_size"]
    base = os.path.join(tempfile.mkdtemp(prefix="serve-timeline-"), "events")
    server = serve_process.start(model, ["--num-kv-blocks", "1024"], env={
        "PYTHONPATH": f"{ROOT / 'bench' / 'serve_timeline_hooks'}:{ROOT}",
        "FOLIO_TIMELINE": base})
    try:
        warm = serve_client.make_prompts(8, 128, vocab, args.seed + 1000)
        asyncio.run(send_all(server.base_url, warm, [0.0] * len(warm), args.output_len))
        prompts = serve_client.make_prompts(args.num_prompts, input_len, vocab, args.seed + 77)
        begin, results = asyncio.run(send_all(server.base_url, prompts, times,
                                              args.output_len))
    finally:
        server.stop()
    adds, plans, step_results, runs = read_events(base)
    adds = adds[len(warm):]
    first_step: dict[int, int] = {}
    for step in sorted(plans):
        if plans[step][4] != "-":
            for entry in plans[step][4].split(","):
                first_step.setdefault(int(entry.split(":")[0]), step)
    plan = predict([TraceRequest(t, input_len, args.output_len) for t in times],
                   load_cost(args.cost)).requests
    print("request: arrival ms | sent late, added after sending, planned after adding, "
          "executor ran (ms) | its prompt step | TTFT measured / planned")
    for index, (result, add) in enumerate(zip(results, adds)):
        step = first_step[int(add[4])]
        planned = float(plans[step][1])
        run = runs.get(step)
        print(f"{index:3d}: {times[index] * 1000:7.0f} | "
              f"{(result['sent'] - begin - times[index]) * 1000:5.1f} "
              f"{(float(add[1]) - result['sent']) * 1000:6.1f} "
              f"{(planned - float(add[1])) * 1000:6.1f} "
              f"{(run[1] - run[0]) * 1000 if run else float('nan'):6.1f} | step {step} "
              f"(new {plans[step][4]}, {plans[step][3]} running) | "
              f"{result['ttft'] * 1000:6.1f} / {plan[index].ttft_ms:6.1f}")
    # Requests sent within 20 ms of the one before: when they reached the scheduler, and
    # whether their prompts shared a step.
    close = [(a, b) for a, b, sent_a, sent_b in zip(adds, adds[1:], results, results[1:])
             if sent_b["sent"] - sent_a["sent"] < 0.02]
    if close:
        gaps = [(float(b[1]) - float(a[1])) * 1000 for a, b in close]
        shared = sum(first_step[int(a[4])] == first_step[int(b[4])] for a, b in close)
        reached = [(float(add[1]) - result["sent"]) * 1000 for add, result in zip(adds, results)]
        print(f"{len(close)} requests sent within 20 ms of the one before reached the "
              f"scheduler {min(gaps):.1f}-{max(gaps):.1f} ms after it ({shared} in its prompt "
              f"step); every request reached it {min(reached):.1f}-{max(reached):.1f} ms "
              "after it was sent")


if __name__ == "__main__":
    main()
