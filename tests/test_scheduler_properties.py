"""Property-based tests of the block pool and scheduler against a fake executor."""

from __future__ import annotations

from collections import Counter

from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from scheduler.block_pool import BlockPool
from scheduler.scheduler import Scheduler
from shared.config import SchedulerConfig
from shared.sampling_params import SamplingParams
from tests.fake_executor import FakeExecutor

BLOCK_SIZE = 4


class SchedulerMachine(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.config = SchedulerConfig(num_kv_blocks=24, block_size=BLOCK_SIZE, max_num_seqs=6,
                                      max_num_batched_tokens=20, max_model_len=64,
                                      eos_token_ids=(3,), vocab_size=1000)
        self.scheduler = Scheduler(self.config)
        self.executor = FakeExecutor(BLOCK_SIZE)
        self.count = 0
        self.finished: dict[str, str] = {}

    @rule(prompt_len=st.integers(1, 70), max_tokens=st.integers(1, 30))
    def add(self, prompt_len, max_tokens):
        request_id = f"r{self.count}"
        self.count += 1
        prompt = [(self.count * 31 + i) % 997 + 1 for i in range(prompt_len)]
        try:
            self.scheduler.add_request(request_id, prompt, SamplingParams(max_tokens=max_tokens))
        except ValueError:
            assert prompt_len > self.config.max_request_len
            return
        assert prompt_len <= self.config.max_request_len

    @precondition(lambda self: self.scheduler.requests)
    @rule(data=st.data())
    def abort(self, data):
        request_id = data.draw(st.sampled_from(sorted(self.scheduler.requests)))
        assert self.scheduler.abort_request(request_id)
        self.finished[request_id] = "abort"

    @rule(steps=st.integers(1, 5))
    def step(self, steps):
        for _ in range(steps):
            self._one_step()

    def _one_step(self):
        plan = self.scheduler.schedule()
        assert plan.num_scheduled_tokens <= self.config.max_num_batched_tokens
        result = self.executor.execute(plan)
        for output in self.scheduler.update(plan, result):
            if output.finished:
                self.finished[output.request_id] = output.finish_reason

    @invariant()
    def blocks_accounted(self):
        pool = self.scheduler.pool
        owners = Counter()
        for request in self.scheduler.requests.values():
            owners.update(request.block_ids)
        assert pool.num_free + pool.num_used == pool.num_blocks
        assert sum(1 for b in range(pool.num_blocks) if pool.ref_count(b) > 0) == pool.num_used
        for block_id in range(pool.num_blocks):
            assert pool.ref_count(block_id) == owners[block_id]
        for request in self.scheduler.waiting:
            assert not request.block_ids and request.num_computed_tokens == 0
        assert len(self.scheduler.running) <= self.config.max_num_seqs

    def teardown(self):
        # No request waits forever: with no new arrivals everything finishes.
        for _ in range(2000):
            if not self.scheduler.has_unfinished_requests():
                break
            self._one_step()
        assert not self.scheduler.has_unfinished_requests()
        self._one_step()   # delivers the last forget notices
        pool = self.scheduler.pool
        assert pool.num_free == pool.num_blocks
        assert not self.executor.requests, "executor still holds finished requests"


TestScheduler = SchedulerMachine.TestCase
TestScheduler.settings = settings(max_examples=60, stateful_step_count=40, deadline=None)


def test_block_pool_refcounts():
    pool = BlockPool(4)
    a = pool.allocate(2)
    pool.share(a[0])
    pool.release(a)
    assert pool.num_free == 3 and pool.ref_count(a[0]) == 1
    pool.release([a[0]])
    assert pool.num_free == 4
    try:
        pool.release([a[0]])
    except ValueError as error:
        assert "released while free" in str(error)
    else:
        raise AssertionError("double release must fail")
