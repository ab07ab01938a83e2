"""The executor's CPU thread policy: one torch (OpenMP) thread per core it may run on, and
the per-thread readings that executor/thread_governor.py adapts that count by.

`folio serve` decides which cores each process may use (folio/placement.py) and starts the
executor with that affinity; here the executor only sizes its thread pool to match, so no
two of its threads share a core (OpenMP barriers spin: an oversubscribed core stalls every
thread of the step).
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass
from pathlib import Path

import torch

from folio.shared.cpus import usable_cores

log = logging.getLogger("folio.executor")


def apply_cpu_threads(requested: int | None) -> int:
    """Set torch's intra-op thread count: `requested`, or one per usable core."""
    threads = requested if requested is not None else max(1, len(usable_cores()))
    torch.set_num_threads(threads)
    log.info("CPU threads: %d (%s)", threads,
             "--cpu-threads" if requested is not None else "one per usable core")
    return threads


@dataclass(frozen=True)
class ThreadTimes:
    """One reading of this process's threads, at a monotonic `at_s`."""
    at_s: float
    tasks: dict[int, tuple[float, float]]   # thread id -> (CPU s, run delay s) so far


def read_thread_times() -> ThreadTimes | None:
    """Each thread's CPU time and run delay (time runnable but waiting for a core) from
    /proc/self/task/*/schedstat, or None without /proc (not Linux)."""
    tasks = {}
    try:
        entries = list(Path("/proc/self/task").iterdir())
    except OSError:
        return None
    for task in entries:
        try:
            cpu_ns, wait_ns = (task / "schedstat").read_text().split()[:2]
            tasks[int(task.name)] = (int(cpu_ns) / 1e9, int(wait_ns) / 1e9)
        except (OSError, ValueError):
            continue   # a thread that just ended
    return ThreadTimes(time.monotonic(), tasks) if tasks else None
