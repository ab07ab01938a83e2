"""What one user's stream costs each `folio serve` process, per token: how often it wakes,
how much CPU it takes, and how long its threads waited for a core (run-delay).

    python bench/control_wakeups.py --model /tmp/smollm2-bf16 --tokens 256
    python bench/control_wakeups.py --model M -- --cpu-placement split

It starts `folio serve` (flags after `--` go to it), streams one completion of --tokens
tokens (EOS ignored), and reads every thread of every process of the server from /proc
before and after: `schedstat` (CPU time, time runnable but waiting for a core, timeslices)
and `status` (voluntary switches: the thread slept and woke; involuntary: it was
preempted). The executor's run-delay per token is what the control processes and anything
else on the machine cost its compute threads: an OpenMP step waits for its slowest thread.
Run it on a quiet machine: other work shows up as run-delay too.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
import urllib.request
from collections import defaultdict
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.serve_process import start  # noqa: E402

FIELDS = ("cpu_ms", "run_delay_ms", "voluntary", "involuntary")


def descendants(root: int) -> dict[int, str]:
    """pid -> command name of `root` and every process below it."""
    parents: dict[int, tuple[int, str]] = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                stat = (entry / "stat").read_text()
            except OSError:
                continue
            name = stat[stat.index("(") + 1:stat.rindex(")")]
            parents[int(entry.name)] = (int(stat[stat.rindex(")") + 2:].split()[1]), name)
    found = {root: parents.get(root, (0, "?"))[1]}
    grew = True
    while grew:
        grew = False
        for pid, (parent, name) in parents.items():
            if parent in found and pid not in found:
                found[pid] = name
                grew = True
    return found


def snapshot(pids: dict[int, str]) -> dict[str, dict[str, float]]:
    """Per process name, summed over its threads."""
    totals: dict[str, dict[str, float]] = defaultdict(lambda: dict.fromkeys(FIELDS, 0.0))
    for pid, name in pids.items():
        for task in Path(f"/proc/{pid}/task").glob("*"):
            try:
                cpu, delay, _ = (int(v) for v in (task / "schedstat").read_text().split())
                status = dict(line.split(":\t", 1) for line in
                              (task / "status").read_text().splitlines() if ":\t" in line)
            except (OSError, ValueError):
                continue
            row = totals[name]
            row["cpu_ms"] += cpu / 1e6
            row["run_delay_ms"] += delay / 1e6
            row["voluntary"] += int(status["voluntary_ctxt_switches"])
            row["involuntary"] += int(status["nonvoluntary_ctxt_switches"])
    return totals


def stream(base_url: str, model: str, tokens: int) -> tuple[int, float]:
    """(tokens streamed, seconds from the first chunk to the last). Tokens are counted
    from the usage the last chunk carries: under multi-step decoding a chunk holds several."""
    body = json.dumps({"model": model, "prompt": "Once upon a time", "max_tokens": tokens,
                       "temperature": 0, "ignore_eos": True, "stream": True,
                       "stream_options": {"include_usage": True}}).encode()
    request = urllib.request.Request(f"{base_url}/v1/completions", body,
                                     {"Content-Type": "application/json"})
    count, first, last = 0, None, None
    with urllib.request.urlopen(request, timeout=600) as response:
        for line in response:
            if not line.startswith(b"data: {"):
                continue
            chunk = json.loads(line[len(b"data: "):])
            if chunk.get("usage"):
                count = chunk["usage"]["completion_tokens"]
            if chunk.get("choices") and chunk["choices"][0].get("text"):
                last = time.perf_counter()
                first = first or last
    return count, (last - first) if count > 1 and first is not None else 0.0


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", required=True)
    parser.add_argument("--tokens", type=int, default=256)
    parser.add_argument("--json", action="store_true")
    parser.add_argument("serve_args", nargs="*", help="after --: flags for folio serve")
    args = parser.parse_args()
    server = start(args.model, args.serve_args)
    try:
        with urllib.request.urlopen(f"{server.base_url}/v1/models") as response:
            served = json.load(response)["data"][0]["id"]
        stream(server.base_url, served, 8)                      # warm-up
        pids = descendants(server.proc.pid)
        load = os.getloadavg()
        before = snapshot(pids)
        count, seconds = stream(server.base_url, served, args.tokens)
        after = snapshot(pids)
    finally:
        server.stop()
    per_token = {name: {field: (after[name][field] - before[name][field]) / count
                        for field in FIELDS} for name in after}
    report = {"tokens": count, "tpot_ms": seconds / max(count - 1, 1) * 1e3,
              "load_average": load, "per_token": per_token, "serve_args": args.serve_args}
    if args.json:
        print(json.dumps(report))
        return
    print(f"load average {' '.join(f'{x:.2f}' for x in load)}; {count} tokens, "
          f"TPOT {report['tpot_ms']:.2f} ms; per token:")
    print(f"{'process':<20} {'CPU ms':>8} {'run-delay ms':>13} {'wakes':>7} {'preempted':>10}")
    for name, row in sorted(per_token.items()):
        print(f"{name:<20} {row['cpu_ms']:>8.2f} {row['run_delay_ms']:>13.2f} "
              f"{row['voluntary']:>7.2f} {row['involuntary']:>10.2f}")


if __name__ == "__main__":
    main()
