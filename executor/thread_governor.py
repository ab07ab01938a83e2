"""The executor's CPU thread count, adapted to the cores the machine actually gives it.

One OpenMP thread per core is fastest while those cores are free. When another busy process
shares one of them, every barrier of every step waits for the thread that lost its core:
two threads then run 2-4x slower than one (docs/benchmarks.md, "CPU placement"). So when
`--cpu-threads` is not given, the executor looks once per window, between steps, at how long
its compute threads (those runnable for most of the window: the OpenMP team, which spins
between parallel regions) were runnable but waiting for a core (the kernel's run delay,
executor/cpu_threads.py). Its other threads (sockets, heartbeats) sleep most of the time and
are not counted. With `wait` the largest such share of a window:

- drop: `wait` over `drop_wait` in `drop_windows` windows in a row runs one thread fewer.
  Fewer windows are not enough: on a quiet machine a workload's start (the client sending
  its prompts, the frontend taking them in) kept two windows of 1-2 s each over it (42-71%,
  docs/benchmarks.md); a quiet run should keep its threads through that.
- probe: below the maximum, after a window that was not crowded at the count it has, and
  when the probe is due, it runs one window with one thread more and judges that window
  alone: `wait` at most `drop_wait` keeps the thread; so does a window that computed
  `faster_by` more tokens per second of forward time than the window before the probe
  (at one thread fewer); else it goes back down.
- a kept count with such a rate is not dropped while its windows stay that much faster than
  one thread fewer was, however long its threads wait: on two cores the engine's own
  frontend and scheduler keep them waiting 25-35% while two threads still beat one. Only
  windows crowded and not faster count toward a drop. Only the
  threads' own wait at the higher count tells whether that count pays; how idle the cores
  look at the lower count does not (the frontend, scheduler and a benchmark client keep
  part of the second core busy, which the idle-core rule this replaces read as a neighbour
  for the rest of the run). The first probe is due `probe_first_s` after a drop; each
  failed one doubles the interval up to `probe_max_s`, so a neighbour that stays costs one
  slow window in that many seconds, and one that left costs at most that many seconds.

The rules are pure functions over readings (`worst_wait_share`, `decide`); `ThreadGovernor`
reads /proc, applies the count and logs each decided change as `CPU threads 2 -> 1: ...`.
Linux only; elsewhere (no /proc) the count stays as set.
"""

from __future__ import annotations

import logging
import math
import time
from dataclasses import dataclass, replace
from typing import Callable

from folio.executor.cpu_threads import ThreadTimes, read_thread_times

log = logging.getLogger("folio.executor")


@dataclass(frozen=True)
class GovernorSettings:
    window_s: float = 1.0      # how often the readings are compared
    drop_wait: float = 0.25    # share of a window a compute thread spent waiting for a core
    drop_windows: int = 3      # windows over drop_wait in a row before a thread goes
    probe_first_s: float = 2.0   # the first probe at one thread more, this long after a drop
    probe_max_s: float = 8.0     # failed probes double the interval up to this
    faster_by: float = 0.10   # a count that computes this much faster than one fewer stays


@dataclass(frozen=True)
class GovernorState:
    threads: int               # the count for the next window
    probe_interval_s: float
    next_probe_s: float = math.inf   # monotonic time of the next probe
    probing: bool = False      # the next window runs one thread more than the decided count
    strikes: int = 0           # windows over drop_wait in a row
    # Tokens per second of forward time at one thread fewer than `threads`: measured in the
    # window before a probe, kept while that count stays (None: not measured).
    rate_below: float | None = None

    @staticmethod
    def start(threads: int, settings: GovernorSettings) -> GovernorState:
        return GovernorState(threads, settings.probe_first_s)


# What a decision did, for the log: a drop, a probe begun, a probe kept or failed, or None.
DROP, PROBE, KEPT, FAILED = "drop", "probe", "kept", "failed"


def worst_wait_share(last: ThreadTimes, now: ThreadTimes, busy_share: float = 0.5) -> float:
    """The largest share of the window that a thread runnable (running or waiting for a
    core) for at least `busy_share` of it spent waiting."""
    elapsed = now.at_s - last.at_s
    if elapsed <= 0:
        return 0.0
    worst = 0.0
    for tid, (cpu_s, wait_s) in now.tasks.items():
        before = last.tasks.get(tid)
        if before is None:
            continue   # a thread born in the window (a new OpenMP worker): no baseline
        if (cpu_s - before[0]) + (wait_s - before[1]) >= busy_share * elapsed:
            worst = max(worst, (wait_s - before[1]) / elapsed)
    return worst


def decide(state: GovernorState, wait: float, now_s: float, max_threads: int,
           settings: GovernorSettings, rate: float | None = None
           ) -> tuple[GovernorState, str | None]:
    """The state for the next window, given the last window's worst wait share and its
    compute rate (tokens per second of forward time; None: no step ran), and what changed
    (DROP, PROBE, KEPT, FAILED or None).

    Waiting alone does not prove a count too many: on two cores the engine's own frontend
    and scheduler (and a client beside them) keep the executor's threads waiting 25-35%
    while two threads still compute faster than one. So a count whose window computed
    `faster_by` faster than the window before its probe, at one thread fewer, stays
    however long its threads wait; a neighbour that slows it below that is dropped for."""
    crowded = wait > settings.drop_wait
    if state.probing:   # the last window ran state.threads: judge it alone
        if crowded and not _faster(rate, state.rate_below, settings):
            interval = min(state.probe_interval_s * 2, settings.probe_max_s)
            return GovernorState(state.threads - 1, interval, now_s + interval), FAILED
        interval = settings.probe_first_s
        next_probe = now_s + interval if state.threads < max_threads else math.inf
        return GovernorState(state.threads, interval, next_probe,
                             rate_below=state.rate_below), KEPT
    # A strike: a window crowded and not faster than one thread fewer was.
    strikes = state.strikes + 1 if crowded and not _faster(rate, state.rate_below,
                                                           settings) else 0
    if state.threads > 1 and strikes >= settings.drop_windows:
        return GovernorState(state.threads - 1, state.probe_interval_s,
                             now_s + state.probe_interval_s), DROP
    # No probe while the count it has is crowded already: one thread more would wait more.
    if state.threads < max_threads and strikes == 0 and now_s >= state.next_probe_s:
        return replace(state, threads=state.threads + 1, probing=True, strikes=0,
                       rate_below=rate), PROBE
    return replace(state, strikes=strikes), None


def _faster(rate: float | None, below: float | None, settings: GovernorSettings) -> bool:
    return rate is not None and below is not None and rate >= below * (1 + settings.faster_by)


class ThreadGovernor:
    """Call `after_step()` after each step; it applies a new count through `set_threads`
    when one is due and returns it (else None)."""

    def __init__(self, max_threads: int, set_threads: Callable[[int], None],
                 settings: GovernorSettings = GovernorSettings(),
                 read: Callable[[], ThreadTimes | None] = read_thread_times,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.max_threads = max_threads
        self.settings = settings
        self.state = GovernorState.start(max_threads, settings)
        self._set = set_threads
        self._read = read
        self._clock = clock
        self._last = read()
        self._tokens, self._forward_s = 0, 0.0   # this window's, from after_step

    @property
    def threads(self) -> int:
        """The count running now (during a probe window, the one probed)."""
        return self.state.threads

    @property
    def active(self) -> bool:
        return self._last is not None and self.max_threads > 1

    def after_step(self, tokens: int = 0, forward_s: float = 0.0) -> int | None:
        """After a step that computed `tokens` in `forward_s` seconds."""
        self._tokens += tokens
        self._forward_s += forward_s
        if not self.active or self._clock() - self._last.at_s < self.settings.window_s:
            return None
        reading = self._read()
        if reading is None:
            return None
        last, self._last = self._last, reading
        wait = worst_wait_share(last, reading)
        elapsed = reading.at_s - last.at_s
        rate = self._tokens / self._forward_s if self._tokens and self._forward_s > 0 else None
        self._tokens, self._forward_s = 0, 0.0
        before = self.state
        self.state, event = decide(before, wait, reading.at_s, self.max_threads, self.settings,
                                   rate)
        log.debug("CPU threads %d: worst wait %.0f%% of %.1f s, %s tokens/s of forward",
                  before.threads, wait * 100, elapsed, "-" if rate is None else f"{rate:.0f}")
        self._log(event, before, wait, elapsed, rate)
        if self.state.threads == before.threads:
            return None
        self._set(self.state.threads)
        return self.state.threads

    def _log(self, event: str | None, before: GovernorState, wait: float, elapsed: float,
             rate: float | None) -> None:
        new = self.state.threads
        waited = f"its threads waited {wait:.0%} of the last {elapsed:.1f} s for a core"
        if event == DROP:
            log.info("CPU threads %d -> %d: %s (over %.0f%% for %d windows in a row); "
                     "a window at %d in %.0f s", before.threads, new, waited,
                     self.settings.drop_wait * 100, self.settings.drop_windows,
                     before.threads, self.state.next_probe_s - self._last.at_s)
        elif event == KEPT:   # the decided count rises only now: one line per real change
            below = self.state.rate_below
            faster = "" if rate is None or below is None else \
                f" ({rate:.0f} tokens/s of forward against {below:.0f} at {new - 1})"
            log.info("CPU threads %d -> %d: %s at %d%s", new - 1, new, waited, new, faster)
        elif event == PROBE:
            log.debug("CPU threads: a window at %d to probe", new)
        elif event == FAILED:
            log.debug("CPU threads back to %d: %s at %d; next probe in %.0f s", new, waited,
                      before.threads, self.state.probe_interval_s)
