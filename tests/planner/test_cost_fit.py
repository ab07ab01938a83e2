"""The calibration's measuring loop and fit recover a known step cost: a fake executor
whose steps "take" a known linear cost on a fake clock, stepped by the real Scheduler."""

from __future__ import annotations

import pytest

from folio.planner.calibrate import Grid, Stepper, collect, fit_samples
from folio.planner.fit import fit_non_negative
from folio.planner.simulator.loop import SpeedExecutor
from folio.scheduler.scheduler import Scheduler
from folio.shared.config import SchedulerConfig

KNOWN = {"base": 4.0, "per_prefill_token": 0.05, "per_decode_row": 0.7,
         "per_decode_kcontext": 2.5, "per_prefill_kattention": 0.01}


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


class TimedExecutor(SpeedExecutor):
    """Advances the clock by KNOWN's cost of each plan, counted from its own state: the
    tokens each request had computed before the step."""

    def __init__(self, clock: Clock) -> None:
        super().__init__()
        self.clock = clock

    def execute(self, plan):
        ms = KNOWN["base"]
        before = {new.handle: new.num_computed_tokens for new in plan.new_requests}
        counts = {new.handle: new.num_new_tokens for new in plan.new_requests}
        for handle, count in zip(plan.running_handles, plan.running_num_tokens):
            before[handle], counts[handle] = self.held[handle][1], count
        for handle, count in counts.items():
            if count == 1:
                ms += KNOWN["per_decode_row"] + KNOWN["per_decode_kcontext"] * (
                    before[handle] + 1) / 1000
            else:   # each new token attends to the cached ones and half the new ones
                ms += KNOWN["per_prefill_token"] * count + KNOWN["per_prefill_kattention"] * (
                    count * before[handle] + count * count / 2) / 1000
        self.clock.now += ms / 1000
        return super().execute(plan)


def test_fit_recovers_a_known_cost():
    clock = Clock()
    config = SchedulerConfig(num_kv_blocks=512, block_size=16, max_model_len=2048,
                             max_num_batched_tokens=1024, vocab_size=1000)
    stepper = Stepper(Scheduler(config), TimedExecutor(clock), clock)
    grid = Grid(chunks=(16, 96, 400), contexts=(0, 160, 640), batches=(1, 5, 12),
                decode_contexts=(48, 300), decode_steps=3, repeats=1)
    samples = collect(stepper, grid, 1000, 2048, 512 * 16)
    assert len({s.rows for s in samples}) >= 10
    executor_ms, scheduler_ms, error = fit_samples(samples)
    for name, value in KNOWN.items():
        assert executor_ms[name] == pytest.approx(value, rel=0.02, abs=1e-6), name
    assert error["median_pct"] < 0.5 and error["r2"] > 0.999
    # The fake clock stands still while the scheduler works: its fitted cost is nil.
    assert scheduler_ms["base"] == pytest.approx(0, abs=1e-9)


def test_fit_keeps_coefficients_non_negative():
    # y = 2 + 3x exactly, plus a feature that would take a negative weight to fit noise.
    features = [[1.0, x, (-1) ** x * 0.01] for x in range(8)]
    targets = [2 + 3 * x - (-1) ** x * 0.0001 for x in range(8)]
    coefficients = fit_non_negative(features, targets)
    assert min(coefficients) >= 0
    assert coefficients[:2] == pytest.approx([2, 3], rel=1e-3)


def test_the_scheduler_is_also_timed_alone_at_large_batches():
    """The scheduler's own cost comes from steps of every batch size asked for, run by the
    real Scheduler on a fake executor (its pool grown to hold the largest batch)."""
    from folio.planner.calibrate import scheduler_samples

    config = SchedulerConfig(num_kv_blocks=8, block_size=16, max_model_len=256,
                             vocab_size=1000, max_num_seqs=64)
    samples = scheduler_samples(config, batches=(1, 16, 64, 256), steps=3)
    decode_rows = {len(s.rows) for s in samples if all(count == 1 for count, _ in s.rows)}
    assert decode_rows == {1, 16, 64}   # 256 is over max_num_seqs
    assert all(s.executor_ms >= 0 and s.scheduler_ms >= 0 for s in samples)
    _, scheduler_ms, _ = fit_samples(samples[:1], samples)
    assert scheduler_ms["base"] >= 0 and scheduler_ms["per_row"] >= 0


def test_each_decode_row_reads_a_context_of_its_own():
    """Decode rows sharing one cached prefix would read it from memory once and then from
    the CPU's caches, and the fit would price a long context at a fraction of what a lone
    request pays: every request of a decode batch brings its own context."""
    config = SchedulerConfig(num_kv_blocks=512, block_size=16, max_model_len=2048,
                             max_num_batched_tokens=1024, vocab_size=1000)

    class Recording(Stepper):
        def __init__(self, *args) -> None:
            super().__init__(*args)
            self.batches: list[list[list[int]]] = []

        def run(self, prompts, max_tokens):
            if max_tokens == grid.decode_steps:
                self.batches.append(prompts)
            return super().run(prompts, max_tokens)

    clock = Clock()
    stepper = Recording(Scheduler(config), TimedExecutor(clock), clock)
    grid = Grid(chunks=(16,), contexts=(0,), batches=(1, 5), decode_contexts=(48, 300),
                decode_steps=3, repeats=1)
    collect(stepper, grid, 1000, 2048, 512 * 16)
    assert sorted(len(batch[0]) for batch in stepper.batches if len(batch) == 5) == [48, 300]
    for batch in stepper.batches:
        assert len({tuple(prompt[:16]) for prompt in batch}) == len(batch)
    # None of their blocks came from the prefix cache: each context was computed.
    assert stepper.scheduler.stats()["prefix_cache_hits"] == 0
