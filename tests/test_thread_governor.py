"""The executor's adaptive CPU thread count (executor/thread_governor.py)."""

from __future__ import annotations

import os

import pytest

from executor.thread_governor import GovernorSettings, Reading, ThreadGovernor, decide, read_proc

SETTINGS = GovernorSettings(window_s=0.0, drop_wait=0.25, raise_idle=0.6, hold_s=4.0,
                            max_hold_s=16.0)


def test_decide_drops_a_thread_that_waits_for_its_core():
    assert decide(2, 2, wait_share=0.5, idle_cores=0.0, since_drop_s=100, hold_s=4,
                  settings=SETTINGS) == 1
    assert decide(1, 2, wait_share=0.9, idle_cores=0.0, since_drop_s=100, hold_s=4,
                  settings=SETTINGS) == 1   # never below one


def test_decide_adds_a_thread_when_a_core_is_idle_and_the_hold_is_over():
    assert decide(1, 2, wait_share=0.0, idle_cores=0.9, since_drop_s=5, hold_s=4,
                  settings=SETTINGS) == 2
    assert decide(1, 2, wait_share=0.0, idle_cores=0.9, since_drop_s=3, hold_s=4,
                  settings=SETTINGS) == 1   # too soon after a drop
    assert decide(1, 2, wait_share=0.0, idle_cores=0.3, since_drop_s=100, hold_s=4,
                  settings=SETTINGS) == 1   # the other core is busy
    assert decide(2, 2, wait_share=0.1, idle_cores=1.5, since_drop_s=100, hold_s=4,
                  settings=SETTINGS) == 2   # already at the maximum


class FakeMachine:
    """Readings that a test scripts: per window, how long the busiest compute thread waited
    for a core, and how idle the cores were. Thread 1 computes; thread 2 (a socket thread)
    sleeps and waits long for a core each time it wakes, which must not count."""

    def __init__(self, cores: int) -> None:
        self.cores = cores
        self.now = 0.0
        self.compute = [0.0, 0.0]   # CPU s, run delay s
        self.sleeper = [0.0, 0.0]
        self.idle = self.total = 0.0

    def advance(self, seconds: float, wait_share: float, idle_cores: float, threads: int):
        self.now += seconds
        self.compute[0] += (1 - wait_share) * seconds
        self.compute[1] += wait_share * seconds
        self.sleeper[0] += 0.01 * seconds
        self.sleeper[1] += 0.3 * seconds
        self.idle += idle_cores * seconds
        self.total += self.cores * seconds

    def read(self, _cores) -> Reading:
        return Reading(self.now, {1: tuple(self.compute), 2: tuple(self.sleeper)}, self.idle,
                       self.total)


@pytest.fixture
def machine(monkeypatch):
    fake = FakeMachine(cores=2)
    monkeypatch.setattr("executor.thread_governor.time.monotonic", lambda: fake.now)
    return fake


def test_a_busy_neighbour_takes_a_thread_and_gives_it_back_when_it_leaves(machine):
    applied = []
    governor = ThreadGovernor(2, [0, 1], applied.append, SETTINGS, read=machine.read)
    machine.advance(1.0, wait_share=0.05, idle_cores=0.0, threads=2)   # quiet: keep both
    assert governor.after_step() is None and governor.threads == 2
    machine.advance(1.0, wait_share=0.5, idle_cores=0.0, threads=2)    # neighbour arrives
    assert governor.after_step() == 1 and applied == [1]
    for _ in range(3):   # still there: the other core stays busy
        machine.advance(1.0, wait_share=0.0, idle_cores=0.1, threads=1)
        assert governor.after_step() is None
    machine.advance(2.0, wait_share=0.0, idle_cores=0.9, threads=1)   # gone, hold over
    assert governor.after_step() == 2 and applied == [1, 2]


def test_a_raise_dropped_at_once_doubles_the_hold(machine):
    governor = ThreadGovernor(2, [0, 1], lambda n: None, SETTINGS, read=machine.read)
    machine.advance(1.0, wait_share=0.6, idle_cores=0.0, threads=2)
    assert governor.after_step() == 1
    machine.advance(4.0, wait_share=0.0, idle_cores=0.8, threads=1)   # a gap in its work
    assert governor.after_step() == 2
    machine.advance(1.0, wait_share=0.6, idle_cores=0.0, threads=2)   # back at once
    assert governor.after_step() == 1
    machine.advance(4.0, wait_share=0.0, idle_cores=0.8, threads=1)   # the old hold: too soon
    assert governor.after_step() is None
    machine.advance(4.0, wait_share=0.0, idle_cores=0.8, threads=1)   # 8 s: the doubled hold
    assert governor.after_step() == 2


def test_no_reading_no_change(machine):
    governor = ThreadGovernor(2, [0, 1], lambda n: None, SETTINGS, read=lambda cores: None)
    assert not governor.active
    machine.advance(1.0, 0.9, 0.0, 2)
    assert governor.after_step() is None and governor.threads == 2


@pytest.mark.skipif(not os.path.exists("/proc/self/task"), reason="needs Linux /proc")
def test_proc_readings_grow_with_time():
    cores = sorted(os.sched_getaffinity(0))
    first = read_proc(cores)
    sum(i * i for i in range(200_000))   # some CPU time passes
    second = read_proc(cores)
    assert first is not None and second is not None
    assert second.at_s > first.at_s and second.total_s >= first.total_s
    assert 0 <= second.idle_s <= second.total_s
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


def test_greedy_output_is_unchanged_while_the_thread_count_flips(llama_dir, machine):
    import torch

    from folio import LLM, SamplingParams
    from tests.hf_oracle import hf_greedy, random_prompts

    prompts, max_tokens = random_prompts(6, 3, 60, vocab=1024, seed=5)
    expected = hf_greedy(llama_dir, prompts, max_tokens, "cpu")
    llm = LLM(str(llama_dir), dtype="float32", device="cpu", num_kv_blocks=256)
    counts = []

    def read(_cores):   # every step a new window: contended, then idle, then contended...
        contended = len(counts) % 2 == 0
        machine.advance(5.0, wait_share=0.9 if contended else 0.0,
                        idle_cores=0.0 if contended else 1.0, threads=2)
        return machine.read(_cores)

    before = torch.get_num_threads()
    try:
        llm.engine.executor.threads = ThreadGovernor(
            2, [0, 1], lambda n: (counts.append(n), torch.set_num_threads(n)), SETTINGS,
            read=read)
        params = [SamplingParams(temperature=0, max_tokens=n) for n in max_tokens]
        outputs = [r.outputs[0].token_ids for r in llm.generate(prompts, params)]
    finally:
        torch.set_num_threads(before)
    assert outputs == expected
    assert counts[:4] == [1, 2, 1, 2]
