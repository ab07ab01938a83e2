"""How long `folio serve` takes to start and to stop, and the CPU each process spends
starting: what every deployment's restart, and every served test, waits for.

    python bench/startup.py --rounds 5                      # the built-in model
    python bench/startup.py --model /tmp/smollm2-bf16 -- --dtype bfloat16

Each round starts `folio serve` (flags after `--` go to it), polls every 20 ms until
/health and /v1/models answer (ready), reads each process's CPU seconds, then sends SIGTERM and
times the exit of the whole process group (stopped). Prints one JSON line per round and
the medians.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.control_wakeups import descendants  # noqa: E402
from bench.serve_process import Server, process_cpu_s  # noqa: E402

POLL_S = 0.02


def one_round(command: list[str]) -> dict:
    started = time.monotonic()
    server = Server("folio serve", command)
    server.wait_ready(poll_s=POLL_S)
    ready = time.monotonic() - started
    cpu = {}
    for pid, name in descendants(server.proc.pid).items():
        role = name.removeprefix("folio-") if name.startswith("folio-") else "serve"
        try:
            cpu[f"{role}_cpu_s"] = round(process_cpu_s(pid), 2)
        except OSError:
            pass
    stopping = time.monotonic()
    os.killpg(server.proc.pid, signal.SIGTERM)
    server.proc.wait(timeout=60)
    while _group_alive(server.proc.pid):   # its children end after it, or with it
        time.sleep(POLL_S)
    return {"ready_s": round(ready, 3), "stopped_s": round(time.monotonic() - stopping, 3),
            **cpu, "loadavg_1m": os.getloadavg()[0]}


def _group_alive(group: int) -> bool:
    """Whether a process of the group still runs (zombies, waiting to be reaped, do not)."""
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
            except OSError:
                continue
            if int(fields[2]) == group and fields[0] != "Z":
                return True
    return False


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", help="default: the built-in model")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("serve_flags", nargs="*", help="after --: flags for folio serve")
    args = parser.parse_args()
    command = [sys.executable, "-m", "folio", "serve", "--port", "PORT",
               *(["--model", args.model] if args.model else []), *args.serve_flags]
    rounds = []
    for _ in range(args.rounds):
        rounds.append(one_round(command))
        print(json.dumps(rounds[-1]), flush=True)
    keys = [k for k in rounds[0] if k != "loadavg_1m"]
    print(json.dumps({"median": {k: statistics.median(r.get(k, 0) for r in rounds)
                                 for k in keys}}))


if __name__ == "__main__":
    main()
