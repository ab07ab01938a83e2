"""The executor's CPU thread count, adapted to the cores the machine actually gives it.

One OpenMP thread per core is fastest while those cores are free. When another busy process
shares one of them, every barrier of every step waits for the thread that lost its core:
two threads then run 2-4x slower than one (docs/benchmarks.md, "CPU placement"). So when
`--cpu-threads` is not given, the executor looks once per window, between steps:

- how long its compute threads (those runnable for most of the window: the OpenMP team,
  which spins between parallel regions) were runnable but waiting for a core (the kernel's run
  delay, /proc/self/task/*/schedstat): when the one that waited longest waited more than
  `drop_wait` of the window, it runs one thread fewer (the rest of the team waits for
  that one at every barrier). Its other threads (sockets, heartbeats) sleep most of the
  time and are not counted;
- how idle the cores it may use were (/proc/stat): with at least `raise_idle` of a core
  idle, it runs one thread more, but not within `hold_s` of the last drop. A raise that is
  dropped again at once doubles that hold (up to `max_hold_s`), so a busy neighbour that
  comes and goes costs a window now and then, not every other window.

Linux only; elsewhere (no /proc) the count stays as set.
"""

from __future__ import annotations

import logging
import os
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

log = logging.getLogger("folio.executor")


@dataclass(frozen=True)
class GovernorSettings:
    window_s: float = 1.0      # how often the readings are compared
    drop_wait: float = 0.25    # share of a thread's window spent waiting for a core
    raise_idle: float = 0.6    # idle cores (summed idle shares) that let a thread be added
    hold_s: float = 4.0        # no raise this soon after a drop
    max_hold_s: float = 64.0


@dataclass(frozen=True)
class Reading:
    at_s: float         # monotonic clock
    tasks: dict[int, tuple[float, float]]   # thread id -> (CPU s, run delay s) so far
    idle_s: float       # idle time summed over the cores it may use
    total_s: float      # elapsed time summed over those cores (same clock as idle_s)


def worst_wait_share(last: Reading, now: Reading, busy_share: float = 0.5) -> float:
    """The largest share of the window that a thread runnable (running or waiting for a
    core) for at least `busy_share` of it spent waiting."""
    elapsed = now.at_s - last.at_s
    worst = 0.0
    for tid, (cpu_s, wait_s) in now.tasks.items():
        before = last.tasks.get(tid)
        if before is None:
            continue
        if (cpu_s - before[0]) + (wait_s - before[1]) >= busy_share * elapsed:
            worst = max(worst, (wait_s - before[1]) / elapsed)
    return worst


def decide(threads: int, max_threads: int, wait_share: float, idle_cores: float,
           since_drop_s: float, hold_s: float, settings: GovernorSettings) -> int:
    """The thread count for the next window."""
    if threads > 1 and wait_share > settings.drop_wait:
        return threads - 1
    if threads < max_threads and idle_cores >= settings.raise_idle and since_drop_s >= hold_s:
        return threads + 1
    return threads


def read_proc(cores: list[int]) -> Reading | None:
    """This process's threads' CPU time and run delay, and its cores' idle time, or None
    without /proc."""
    try:
        tasks = {}
        for task in Path("/proc/self/task").iterdir():
            try:
                cpu_ns, wait_ns = (task / "schedstat").read_text().split()[:2]
                tasks[int(task.name)] = (int(cpu_ns) / 1e9, int(wait_ns) / 1e9)
            except (OSError, ValueError):
                continue   # a thread that just ended
        wanted = {f"cpu{c}" for c in cores}
        idle = total = 0
        for line in Path("/proc/stat").read_text().splitlines():
            name, _, rest = line.partition(" ")
            if name in wanted:
                values = [int(v) for v in rest.split()[:8]]
                idle += values[3] + values[4]   # idle + iowait
                total += sum(values)
    except (OSError, ValueError):
        return None
    tick = os.sysconf("SC_CLK_TCK")
    return Reading(time.monotonic(), tasks, idle / tick, total / tick)


class ThreadGovernor:
    """Call `after_step()` after each step; it applies a new count through `set_threads`
    when one is due and returns it (else None)."""

    def __init__(self, max_threads: int, cores: list[int], set_threads: Callable[[int], None],
                 settings: GovernorSettings = GovernorSettings(),
                 read: Callable[[list[int]], Reading | None] = read_proc) -> None:
        self.max_threads = max_threads
        self.threads = max_threads
        self.settings = settings
        self._cores = cores
        self._set = set_threads
        self._read = read
        self._last = read(cores)
        self._hold_s = settings.hold_s
        self._last_drop_s = float("-inf")
        self._last_raise_s = float("-inf")

    @property
    def active(self) -> bool:
        return self._last is not None and self.max_threads > 1

    def after_step(self) -> int | None:
        if not self.active:
            return None
        last = self._last
        now = time.monotonic()
        if now - last.at_s < self.settings.window_s:
            return None
        reading = self._read(self._cores)
        if reading is None:
            return None
        self._last = reading
        elapsed = reading.at_s - last.at_s
        wait_share = worst_wait_share(last, reading)
        core_span = reading.total_s - last.total_s
        idle_cores = 0.0 if core_span <= 0 else (
            (reading.idle_s - last.idle_s) / core_span * len(self._cores))
        threads = decide(self.threads, self.max_threads, wait_share, idle_cores,
                         now - self._last_drop_s, self._hold_s, self.settings)
        if threads == self.threads:
            return None
        if threads < self.threads:
            # Dropped right after a raise: the neighbour is still there; wait longer.
            quick = now - self._last_raise_s <= 2 * self.settings.window_s + elapsed
            self._hold_s = (min(self._hold_s * 2, self.settings.max_hold_s) if quick
                            else self.settings.hold_s)
            self._last_drop_s = now
            why = f"its threads waited {wait_share:.0%} of the last {elapsed:.1f} s for a core"
        else:
            self._last_raise_s = now
            why = f"{idle_cores:.1f} of its cores were idle over the last {elapsed:.1f} s"
        log.info("CPU threads %d -> %d: %s", self.threads, threads, why)
        self.threads = threads
        self._set(threads)
        return threads
