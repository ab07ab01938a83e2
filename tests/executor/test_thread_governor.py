"""The executor's adaptive CPU thread count (executor/thread_governor.py): its rules on
synthetic readings, the /proc reading, and the executor's use of it. The served end-to-end
check with a real neighbour is tests/processes/test_thread_governor_served.py."""

from __future__ import annotations

import logging
import os

import pytest

from folio.executor.cpu_threads import ThreadTimes, read_thread_times
from folio.executor.thread_governor import (DROP, FAILED, KEPT, PROBE, GovernorSettings,
                                      GovernorState, ThreadGovernor, decide, worst_wait_share)

SETTINGS = GovernorSettings(window_s=1.0, drop_wait=0.25, drop_windows=3, probe_first_s=2.0,
                            probe_max_s=8.0)
NEIGHBOUR = {2: 0.45, 1: 0.05}   # worst wait share per thread count with a busy neighbour
QUIET = {2: 0.08, 1: 0.0}


def run(state: GovernorState, waits: list[float], start_s: float = 0.0,
        max_threads: int = 2) -> tuple[GovernorState, list[str | None]]:
    """Feeds one wait share per 1 s window to `decide`."""
    events = []
    for i, wait in enumerate(waits):
        state, event = decide(state, wait, start_s + i + 1, max_threads, SETTINGS)
        events.append(event)
    return state, events


def test_a_neighbour_that_stays_three_windows_takes_a_thread():
    state, events = run(GovernorState.start(2, SETTINGS), [0.45, 0.45, 0.45])
    assert events == [None, None, DROP] and state.threads == 1


def test_a_blip_of_two_windows_takes_nothing():
    # A workload's start (the frontend taking in a burst of prompts): two windows over the
    # threshold, then quiet; one-window spikes later.
    waits = [0.45, 0.51, 0.1, 0.4, 0.05, 0.3, 0.34, 0.2, 0.6]
    state, events = run(GovernorState.start(2, SETTINGS), waits)
    assert events == [None] * len(waits) and state.threads == 2


def test_never_below_one_thread():
    state, events = run(GovernorState.start(1, SETTINGS), [0.9] * 5, max_threads=1)
    assert events == [None] * 5 and state.threads == 1


def test_after_a_drop_a_probe_keeps_the_thread_once_its_wait_is_low():
    state, _ = run(GovernorState.start(2, SETTINGS), [0.45, 0.45, 0.45])   # dropped at t=3
    state, events = run(state, [0.0, 0.0, 0.08], start_s=3.0)   # the neighbour left
    assert events == [None, PROBE, KEPT]   # probe at t=5 (2 s after), judged at t=6
    assert state.threads == 2 and not state.probing


def test_a_neighbour_that_stays_backs_the_probes_off_up_to_the_bound():
    state, _ = run(GovernorState.start(2, SETTINGS), [0.45, 0.45, 0.45])
    probes_at, failures = [], 0
    for second in range(4, 60):
        wait = NEIGHBOUR[state.threads]
        state, event = decide(state, wait, second, 2, SETTINGS)
        if event == PROBE:
            probes_at.append(second)
        failures += event == FAILED
        assert event != DROP   # it never climbs high enough to need a drop
    assert failures == len(probes_at) - (state.probing is True)
    gaps = [b - a for a, b in zip(probes_at, probes_at[1:])]
    # Each failed probe window (1 s) is followed by a doubled interval, bounded at 8 s.
    assert gaps[:3] == [1 + 4, 1 + 8, 1 + 8] and set(gaps[3:]) == {9}


def test_a_kept_probe_resets_the_interval():
    state, _ = run(GovernorState.start(2, SETTINGS), [0.45, 0.45, 0.45])
    state, events = run(state, [0.05, 0.05, 0.45, 0.05, 0.05, 0.05, 0.05, 0.45], start_s=3)
    assert events[2:4] == [FAILED, None] and events.count(PROBE) == 2
    assert state.probe_interval_s == 8.0 and events[-1] == FAILED
    state, events = run(state, [0.0] * 8 + [0.05], start_s=11)
    assert KEPT in events and state.threads == 2 and state.probe_interval_s == 2.0


def test_no_probe_while_even_the_lower_count_is_crowded():
    state, _ = run(GovernorState.start(2, SETTINGS), [0.45, 0.45, 0.45])
    state, events = run(state, [0.5] * 10, start_s=3.0)   # a machine busy even for one
    assert events == [None] * 10 and state.threads == 1
    state, events = run(state, [0.1, 0.1], start_s=13.0)   # it calms down: probe at once
    assert events == [PROBE, KEPT] and state.threads == 2


def test_from_four_threads_it_steps_down_and_back_one_thread_at_a_time():
    state = GovernorState.start(4, SETTINGS)
    state, events = run(state, [0.5] * 9, max_threads=4)
    assert events.count(DROP) == 3 and state.threads == 1
    state, events = run(state, [0.0] * 20, start_s=9, max_threads=4)
    assert events.count(KEPT) == 3 and state.threads == 4
    assert state.next_probe_s == float("inf")   # at the maximum: nothing left to probe


def test_wait_share_counts_only_threads_busy_for_most_of_the_window():
    last = ThreadTimes(0.0, {1: (0.0, 0.0), 2: (0.0, 0.0)})
    now = ThreadTimes(1.0, {1: (0.6, 0.4),      # computes, waited 40%
                            2: (0.01, 0.3),     # a socket thread: asleep, waits on waking
                            3: (0.9, 0.1)})     # born in the window: no baseline
    assert worst_wait_share(last, now) == pytest.approx(0.4)
    assert worst_wait_share(now, now) == 0.0


class FakeMachine:
    """Readings a test scripts per window: thread 1 computes and waited `wait` of the
    window for a core; thread 2 (a socket thread) sleeps and waits long each time it wakes,
    which must not count."""

    def __init__(self) -> None:
        self.now = 0.0
        self.compute = (0.0, 0.0)   # CPU s, run delay s
        self.sleeper = (0.0, 0.0)

    def advance(self, seconds: float, wait: float) -> None:
        self.now += seconds
        self.compute = (self.compute[0] + (1 - wait) * seconds, self.compute[1] + wait * seconds)
        self.sleeper = (self.sleeper[0] + 0.01 * seconds, self.sleeper[1] + 0.3 * seconds)

    def read(self) -> ThreadTimes:
        return ThreadTimes(self.now, {1: self.compute, 2: self.sleeper})


def governed(machine: FakeMachine, applied: list[int]) -> ThreadGovernor:
    return ThreadGovernor(2, applied.append, SETTINGS, read=machine.read,
                          clock=lambda: machine.now)


def test_a_neighbour_comes_and_goes_and_the_thread_comes_back(caplog):
    caplog.set_level(logging.INFO, logger="folio.executor")
    machine, applied = FakeMachine(), []
    governor = governed(machine, applied)
    counts = []
    for second in range(40):   # a neighbour from 5 s to 20 s
        waits = NEIGHBOUR if 5 <= second < 20 else QUIET
        machine.advance(1.0, waits[governor.threads])
        governor.after_step()
        counts.append(governor.state.threads if not governor.state.probing else "probe")
    assert counts[:7] == [2] * 7 and counts[7] == 1   # three windows to drop
    back = next(s for s in range(20, 40) if counts[s] == 2)
    assert back - 20 <= SETTINGS.probe_max_s + 2   # seconds, not the rest of the run
    assert counts[back:] == [2] * (40 - back)
    lines = [r.getMessage() for r in caplog.records if r.levelname == "INFO"]
    assert lines[0].startswith("CPU threads 2 -> 1: its threads waited 45%")
    assert lines[-1].startswith("CPU threads 1 -> 2: its threads waited 8%")
    assert applied[0] == 1 and applied[-1] == 2


def test_within_a_window_nothing_is_read():
    machine, reads = FakeMachine(), []

    def read():
        reads.append(machine.now)
        return machine.read()

    governor = ThreadGovernor(2, lambda n: None, SETTINGS, read=read, clock=lambda: machine.now)
    machine.advance(0.5, 0.9)
    assert governor.after_step() is None and reads == [0.0]   # only the first reading


def test_no_reading_no_change():
    governor = ThreadGovernor(2, lambda n: None, SETTINGS, read=lambda: None)
    assert not governor.active
    assert governor.after_step() is None and governor.threads == 2


@pytest.mark.skipif(not os.path.exists("/proc/self/task"), reason="needs Linux /proc")
def test_proc_readings_grow_with_time():
    first = read_thread_times()
    sum(i * i for i in range(200_000))   # some CPU time passes
    second = read_thread_times()
    assert first is not None and second is not None and second.at_s > first.at_s
    main = os.getpid()   # the main thread's CPU time grew; run delays never shrink
    assert second.tasks[main][0] > first.tasks[main][0]
    assert all(second.tasks[t][1] >= first.tasks[t][1] for t in first.tasks if t in second.tasks)


def test_the_executor_governs_only_a_thread_count_nobody_fixed(llama_dir):
    from folio import LLM

    fixed = LLM(str(llama_dir), device="cpu", num_kv_blocks=64, cpu_threads=1)
    assert fixed.engine.executor.threads is None
    free = LLM(str(llama_dir), device="cpu", num_kv_blocks=64)
    governor = free.engine.executor.threads
    if len(os.sched_getaffinity(0)) > 1:
        assert isinstance(governor, ThreadGovernor) and governor.active


class RateBlindGovernor(ThreadGovernor):
    """Sees the readings but not the steps' real compute rate: two threads that happened to
    compute 10% faster than one (a quiet moment of the machine) would keep their thread
    however crowded the fake readings say they are, and the count would stop flipping."""

    def after_step(self, tokens: int = 0, forward_s: float = 0.0) -> int | None:
        return super().after_step()


def test_greedy_output_is_unchanged_while_the_thread_count_flips(llama_dir):
    import torch

    from folio import LLM, SamplingParams
    from tests.hf_oracle import hf_greedy, random_prompts

    prompts, max_tokens = random_prompts(6, 3, 60, vocab=1024, seed=5)
    expected = hf_greedy(llama_dir, prompts, max_tokens, "cpu")
    llm = LLM(str(llama_dir), dtype="float32", device="cpu", num_kv_blocks=256)
    machine, counts = FakeMachine(), []
    flipping = GovernorSettings(window_s=1.0, drop_wait=0.25, drop_windows=1,
                                probe_first_s=1.0, probe_max_s=1.0)

    def read():   # every step a new window; crowded at 2 threads, quiet at 1: it flips
        machine.advance(1.0, 0.9 if not counts or counts[-1] == 2 else 0.0)
        return machine.read()

    before = torch.get_num_threads()
    try:
        llm.engine.executor.threads = RateBlindGovernor(
            2, lambda n: (counts.append(n), torch.set_num_threads(n)), flipping, read=read,
            clock=lambda: machine.now + 1.0)   # each step: a window has passed
        params = [SamplingParams(temperature=0, max_tokens=n) for n in max_tokens]
        outputs = [r.outputs[0].token_ids for r in llm.generate(prompts, params)]
    finally:
        torch.set_num_threads(before)
    assert outputs == expected
    assert counts[:4] == [1, 2, 1, 2]


def test_a_probe_that_waits_but_computes_faster_keeps_the_thread_until_a_neighbour_slows_it():
    # The engine's own processes keep two threads waiting ~30% on two cores; two threads
    # still compute 1.6x one thread's tokens per forward second.
    state, _ = run(GovernorState.start(2, SETTINGS), [0.45, 0.45, 0.45])   # dropped at t=3
    state, event = decide(state, 0.05, 4.0, 2, SETTINGS, rate=100.0)
    state, event = decide(state, 0.05, 5.0, 2, SETTINGS, rate=100.0)
    assert event == PROBE and state.rate_below == 100.0
    state, event = decide(state, 0.30, 6.0, 2, SETTINGS, rate=160.0)
    assert event == KEPT and state.threads == 2
    for second in range(7, 20):   # waiting, but faster than one thread: it stays
        state, event = decide(state, 0.30, float(second), 2, SETTINGS, rate=155.0)
        assert event is None and state.threads == 2
    for i in range(3):   # a neighbour: slower than one thread was, three windows
        state, event = decide(state, 0.45, 20.0 + i, 2, SETTINGS, rate=90.0)
    assert event == DROP and state.threads == 1


def test_a_probe_that_waits_and_is_not_faster_fails():
    state, _ = run(GovernorState.start(2, SETTINGS), [0.45, 0.45, 0.45])
    state, _ = decide(state, 0.05, 4.0, 2, SETTINGS, rate=100.0)
    state, event = decide(state, 0.05, 5.0, 2, SETTINGS, rate=100.0)
    assert event == PROBE
    state, event = decide(state, 0.40, 6.0, 2, SETTINGS, rate=105.0)   # under 10% faster
    assert event == FAILED and state.threads == 1


def test_the_governor_measures_each_windows_compute_rate(caplog):
    clock = iter([0.0, 1.5, 1.5]).__next__
    readings = iter([ThreadTimes(0.0, {1: (0.0, 0.0)}), ThreadTimes(1.5, {1: (1.0, 0.5)})])
    governor = ThreadGovernor(2, lambda n: None, SETTINGS, read=lambda: next(readings),
                              clock=clock)
    with caplog.at_level(logging.DEBUG, logger="folio.executor"):
        assert governor.after_step(30, 0.2) is None   # within the window
        governor.after_step(30, 0.4)                   # the window ends: 60 tokens in 0.6 s
    assert any(r.getMessage().endswith(", 100 tokens/s of forward") for r in caplog.records), \
        [r.getMessage() for r in caplog.records]
