"""The thread governor under a neighbour that comes and goes: `folio serve` clean against the
same server with a busy-loop process beside it for a while, alternated (A B A B).

    python bench/governor_neighbour.py --rounds 2 -o governor.json
    python bench/governor_neighbour.py --num-prompts 256 --neighbour-start 3 --neighbour-s 15

Each run starts `folio serve` (bench/serve_race.py's server and checkpoint, logging at INFO
into OUT_DIR/logs/), sends a short warm-up, then bench/serve_client.py's workload twice against it:
`during` and `after` (another seed). In the `neighbour` variant one process spinning in
a Python loop starts `--neighbour-start` s into `during` and stops `--neighbour-s` s later;
the `clean` variant has none. `after` shows whether the server got its speed back once the
neighbour left (the governor's state outlives a workload). Reports output tok/s and TPOT p50
of both parts, the load average before each, the executor's `CPU threads` log lines with
their time from the start of `during`, and how long after the neighbour left the thread
count came back.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import re
import subprocess
import sys
import threading
import time
from datetime import datetime
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench.serve_client import add_workload_args, build_workload, run_benchmark  # noqa: E402
from bench.serve_process import Server  # noqa: E402
from bench.serve_race import SERVED_NAME, race_server, serving_model_dir  # noqa: E402

GOVERNOR_LINE = re.compile(r"^(\S+ \S+) folio-executor INFO (CPU threads (\d+) -> (\d+): .*)$")
SPIN = "while True: pass"
VARIANTS = ("clean", "neighbour")


class Neighbour:
    """A busy loop in its own process from `start_s` to `start_s + run_s` after `begin()`
    (wall-clock times of both ends recorded); bounded by its timer, stopped by `end()`."""

    def __init__(self, start_s: float, run_s: float) -> None:
        self.start_s, self.run_s = start_s, run_s
        self.started_at = self.stopped_at = None
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def begin(self) -> None:
        self._thread.start()

    def _run(self) -> None:
        if self._stop.wait(self.start_s):
            return
        proc = subprocess.Popen([sys.executable, "-c", SPIN])
        self.started_at = time.time()
        try:
            self._stop.wait(self.run_s)
        finally:
            proc.kill()
            proc.wait()
            self.stopped_at = time.time()

    def end(self) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(timeout=30)


def governor_lines(log: Path, since: float) -> list[dict]:
    """The executor's `CPU threads A -> B` lines, timed from wall-clock `since` (negative:
    before it, in the warm-up)."""
    lines = []
    for line in log.read_text(errors="replace").splitlines():
        match = GOVERNOR_LINE.match(line)
        if not match:
            continue
        at = datetime.strptime(match[1], "%Y-%m-%d %H:%M:%S,%f").timestamp()
        lines.append({"at_s": round(at - since, 1), "from": int(match[3]),
                      "to": int(match[4]), "line": match[2]})
    return lines


def part(server: Server, prompts, args, seed: int) -> dict:
    report = asyncio.run(run_benchmark(
        server.base_url, prompts, args.output_len, model=SERVED_NAME,
        max_concurrency=args.max_concurrency, request_rate=float("inf"), seed=seed,
        request_timeout=args.request_timeout, deadline=args.deadline))
    keep = ("completed", "duration_s", "output_throughput", "tpot_ms", "loadavg_1m_before",
            "loadavg_1m_after")
    return {k: report[k] for k in keep}


def one_run(variant: str, args, model: Path, round_: int, workloads) -> dict:
    run_dir = args.out_dir / "run" / f"{variant}-{round_}"
    run_dir.mkdir(parents=True, exist_ok=True)
    log = args.out_dir / "logs" / f"{variant}-{round_}.log"
    server = race_server("folio", model, args, log, run_dir)
    neighbour = Neighbour(args.neighbour_start, args.neighbour_s)
    try:
        server.wait_ready(args.startup_timeout)
        warmup, during, after = workloads
        part(server, warmup, args, args.seed)
        began = time.time()
        if variant == "neighbour":
            neighbour.begin()
        first = part(server, during, args, args.seed + 1)
        neighbour.end()
        second = part(server, after, args, args.seed + 2)
    finally:
        try:
            neighbour.end()
        finally:
            server.stop()
    lines = governor_lines(log, began)
    result = {"variant": variant, "round": round_, "during": first, "after": second,
              "governor": lines, "log": str(log)}
    if neighbour.started_at is not None:
        result["neighbour_s"] = [round(neighbour.started_at - began, 1),
                                 round(neighbour.stopped_at - began, 1)]
        gone = neighbour.stopped_at - began
        full = lines[0]["from"] if lines else None   # the count before its first change
        back = [g["at_s"] for g in lines if g["at_s"] >= gone and g["to"] == full]
        result["back_after_s"] = round(back[0] - gone, 1) if back else None
    result["threads_at_end"] = lines[-1]["to"] if lines else "all along the full count"
    return result


def show(result: dict) -> str:
    during, after = result["during"], result["after"]
    text = (f"round {result['round']} {result['variant']}: during {during['output_throughput']:.1f}"
            f" out tok/s (TPOT p50 {during['tpot_ms']['p50']:.1f} ms, {during['duration_s']:.1f}"
            f" s, load {during['loadavg_1m_before']:.2f}), after "
            f"{after['output_throughput']:.1f} (load {after['loadavg_1m_before']:.2f})")
    if "neighbour_s" in result:
        text += (f"; neighbour {result['neighbour_s'][0]}-{result['neighbour_s'][1]} s, "
                 f"threads back {result['back_after_s']} s after it left")
    text += f"; threads at the end: {result['threads_at_end']}"
    for line in result["governor"]:
        text += f"\n    +{line['at_s']:.1f} s {line['line']}"
    return text


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--variants", nargs="+", choices=VARIANTS, default=list(VARIANTS),
                        help="run only these (e.g. `clean` with --folio-arg=--cpu-threads=2)")
    parser.add_argument("--max-concurrency", type=int, default=64)
    parser.add_argument("--neighbour-start", type=float, default=3.0,
                        help="seconds into `during` the busy loop starts")
    parser.add_argument("--neighbour-s", type=float, default=15.0)
    parser.add_argument("--folio-arg", action="append", default=[],
                        help="extra `folio serve` argument (repeat; use --folio-arg=--flag)")
    parser.add_argument("--cache", type=Path, default=ROOT / ".folio-cache")
    parser.add_argument("--startup-timeout", type=float, default=600)
    parser.add_argument("--out-dir", type=Path, default=ROOT / ".folio-cache" / "governor")
    parser.add_argument("-o", "--out", type=Path, default=None)
    add_workload_args(parser)
    args = parser.parse_args(argv)
    model = serving_model_dir(args.cache)
    args.model_dir = model
    (args.out_dir / "logs").mkdir(parents=True, exist_ok=True)
    workloads = (build_workload(args, args.seed + 10_000, min(8, args.num_prompts)),
                 build_workload(args, args.seed + 1), build_workload(args, args.seed + 2))
    runs = []
    for round_ in range(1, args.rounds + 1):
        for variant in args.variants:
            runs.append(one_run(variant, args, model, round_, workloads))
            print(show(runs[-1]), flush=True)
    if args.out:
        args.out.write_text(json.dumps({"argv": sys.argv, "runs": runs}, indent=2))


if __name__ == "__main__":
    main()
