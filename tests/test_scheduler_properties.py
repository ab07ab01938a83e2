"""Property-based tests of the block pools and the scheduler against a fake executor.

Random arrivals (prompts built from a few shared prefixes, n in {1, 2, 3}), aborts, steps,
under config variants drawn once per example (block size, pool sizes, chunked prefill,
prefix caching, recompute / swap / auto preemption). After every rule each block of the GPU
pool and of the swap pool is in exactly one state with the right reference count, and the
fake executor's KV contents agree with what the scheduler believes. At the end every request
finishes within a bounded number of steps with the tokens it would have had alone, and both
pools are entirely free.
"""

from __future__ import annotations

from collections import Counter

from hypothesis import event, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

from scheduler.block_pool import BlockPool, chain_hash
from scheduler.request import RequestStatus
from scheduler.scheduler import Scheduler, child_request_id
from shared.config import SchedulerConfig
from shared.outputs import EngineOutput, FinishReason
from shared.sampling_params import SamplingParams
from tests.fake_executor import FakeExecutor, extend_digests, sample

VOCAB = 64
EOS = 3
MAX_MODEL_LEN = 40
PREFIXES = [[(7 * i + 5 * k) % VOCAB for i in range(24)] for k in range(1, 4)]


@st.composite
def configs(draw) -> SchedulerConfig:
    block_size = draw(st.sampled_from([2, 4]))
    chunked = draw(st.booleans())
    budget = (draw(st.sampled_from([3, 8, 16, 64])) if chunked
              else draw(st.sampled_from([MAX_MODEL_LEN, 64])))
    mode = draw(st.sampled_from(["recompute", "swap", "auto"]))
    # Auto: swapping a block costs 2 s, recomputing a token 1 / prefill_tokens_per_s, so a
    # victim swaps (when the swap pool has room) if its blocks are on average more than
    # 1/4, 1/2 or 3/4 full.
    prefill_tokens_per_s = block_size / draw(st.sampled_from([8, 4, 8 / 3]))
    return SchedulerConfig(
        num_kv_blocks=draw(st.integers(24, 64)) // block_size,
        block_size=block_size,
        max_num_seqs=draw(st.integers(1, 6)),
        max_num_batched_tokens=budget,
        max_model_len=MAX_MODEL_LEN,
        enable_chunked_prefill=chunked,
        eos_token_ids=(EOS,),
        vocab_size=VOCAB,
        enable_prefix_caching=draw(st.booleans()),
        preemption_mode=mode,
        num_swap_blocks=draw(st.sampled_from([0, 3, 6, 16])),
        bytes_per_block=1,
        prefill_tokens_per_s=prefill_tokens_per_s,
        swap_bytes_per_s=1.0,
    )


def expected_outputs(prompt: list[int], sampling: SamplingParams, max_request_len: int
                     ) -> tuple[list[int], str]:
    """What a request produces when run alone: the fake executor's tokens, until a stop."""
    tokens = list(prompt)
    digests = extend_digests([], tokens)
    output: list[int] = []
    while True:
        token = sample(digests[-1], VOCAB)
        output.append(token)
        tokens.append(token)
        extend_digests(digests, tokens)
        if len(output) > sampling.min_tokens and token == EOS:
            return output, FinishReason.STOP
        if len(output) >= sampling.max_tokens or len(tokens) >= max_request_len:
            return output, FinishReason.LENGTH


class Driver:
    """A scheduler and a fake executor stepping together; records every output."""

    def __init__(self, config: SchedulerConfig) -> None:
        self.config = config
        self.scheduler = Scheduler(config)
        self.executor = FakeExecutor(config.block_size, config.num_kv_blocks,
                                     config.num_swap_blocks, VOCAB)
        self.expected: dict[str, tuple[list[int], str]] = {}   # by sample id
        self.emitted: dict[str, list[int]] = {}
        self.finished: dict[str, str] = {}
        self.aborted: set[str] = set()
        self.groups: dict[str, list[str]] = {}                  # request id -> sample ids
        # Prefix hash -> the fake KV its block must hold, for every full block ever computed.
        self.block_contents: dict[bytes, list] = {}

    def add(self, request_id: str, prompt: list[int], sampling: SamplingParams) -> bool:
        try:
            ids = self.scheduler.add_request(request_id, prompt, sampling)
        except ValueError:
            assert len(prompt) > self.config.max_request_len
            return False
        assert len(prompt) <= self.config.max_request_len
        assert ids == [child_request_id(request_id, i, sampling.n) for i in range(sampling.n)]
        expected = expected_outputs(prompt, sampling, self.config.max_request_len)
        for sample_id in ids:
            self.expected[sample_id] = expected
            self.emitted[sample_id] = []
        self.groups[request_id] = ids
        return True

    def abort(self, request_id: str) -> None:
        live = [i for i in self.groups.get(request_id, [request_id])
                if i in self.scheduler.requests]
        assert self.scheduler.abort_request(request_id) == bool(live)
        self.aborted.update(live)   # reported by the next update

    def step(self, abort_in_flight=None) -> None:
        """One iteration; `abort_in_flight(driver)` runs while the step's plan is out."""
        scheduler, config = self.scheduler, self.config
        plan = scheduler.schedule()
        assert plan.num_scheduled_tokens <= config.max_num_batched_tokens
        assert len(plan.new_requests) + len(plan.running_handles) <= config.max_num_seqs
        result = self.executor.execute(plan)
        self._note_block_contents()
        if abort_in_flight is not None:
            abort_in_flight(self)
        for output in scheduler.update(plan, result):
            self._record(output)

    def _note_block_contents(self) -> None:
        size = self.config.block_size
        for request in self.scheduler.running:
            tokens = request.all_token_ids
            parent = None
            for index in range(request.num_computed_tokens // size):
                parent = chain_hash(parent, tokens[index * size:(index + 1) * size])
                if parent not in self.block_contents:
                    digests = extend_digests([], tokens[:(index + 1) * size])
                    positions = range(index * size, (index + 1) * size)
                    self.block_contents[parent] = [(p, tokens[p], digests[p]) for p in positions]

    def _record(self, output: EngineOutput) -> None:
        sample_id = output.request_id
        assert sample_id not in self.finished, f"{sample_id} reported after it finished"
        tokens = self.emitted[sample_id]
        tokens.extend(output.new_token_ids)
        expected, reason = self.expected[sample_id]
        assert tokens == expected[:len(tokens)], f"{sample_id}: {tokens} vs alone {expected}"
        if output.finished:
            self.finished[sample_id] = output.finish_reason
            assert (output.finish_reason == FinishReason.ABORT) == (sample_id in self.aborted)
            if output.finish_reason != FinishReason.ABORT:
                assert (tokens, output.finish_reason) == (expected, reason), sample_id

    def drain(self) -> int:
        """Step with no new arrivals until idle; returns the steps it took."""
        limit = 100 + 4 * self.config.max_request_len * len(self.scheduler.requests)
        steps = 0
        while self.scheduler.has_work():
            assert steps < limit, f"not idle after {steps} steps: {self.scheduler.stats()}"
            self.step()
            steps += 1
        return steps

    def assert_idle(self) -> None:
        scheduler = self.scheduler
        assert not scheduler.requests
        assert not (scheduler.running or scheduler.waiting or scheduler.swapped)
        assert scheduler.pool.num_free == scheduler.pool.num_blocks
        assert scheduler.swap_pool.num_free == scheduler.swap_pool.num_blocks
        assert not self.executor.requests, "executor still holds finished requests"
        assert set(self.finished) == set(self.emitted), "a request never finished"


# ---- invariants -------------------------------------------------------------------------


def check_pool(pool: BlockPool, owners: Counter, name: str) -> None:
    """Each block free, cached-free or used, with as many references as holders."""
    unreferenced = set(pool._unreferenced)
    cached_free = 0
    for block_id in range(pool.num_blocks):
        refs = pool.ref_count(block_id)
        assert refs == owners[block_id], f"{name} block {block_id}: {refs} refs, " \
            f"{owners[block_id]} holders"
        assert (refs == 0) == (block_id in unreferenced), f"{name} block {block_id} queue"
        block_hash = pool.block_hash(block_id)
        if block_hash is not None:
            assert pool.lookup(block_hash) == block_id, f"{name} block {block_id} hash"
            cached_free += refs == 0
    assert len(pool._unreferenced) == len(unreferenced)
    assert all(pool.block_hash(b) == h for h, b in pool._cached.items())
    assert pool.num_cached_free == cached_free
    assert pool.num_free + pool.num_used == pool.num_blocks
    assert pool.num_free == sum(1 for b in range(pool.num_blocks) if pool.ref_count(b) == 0)


def check_scheduler(driver: Driver) -> None:
    scheduler, config, executor = driver.scheduler, driver.config, driver.executor
    size = config.block_size
    statuses = {RequestStatus.WAITING: list(scheduler.waiting),
                RequestStatus.SWAPPED: list(scheduler.swapped),
                RequestStatus.RUNNING: list(scheduler.running),
                RequestStatus.FORKING: [child for owner in scheduler.requests.values()
                                        for child in owner.fork_children]}
    placed = [id(r) for queue in statuses.values() for r in queue]
    assert len(placed) == len(set(placed)) == len(scheduler.requests), "request misplaced"
    for status, queue in statuses.items():
        assert all(r.status is status for r in queue), status
        assert all(scheduler.requests.get(r.request_id) is r for r in queue)
    live = {i for i in driver.emitted if i not in driver.finished and i not in driver.aborted}
    assert set(scheduler.requests) == live, "a request was lost or invented"

    assert len(scheduler.running) <= config.max_num_seqs
    assert [r.admit_seq for r in scheduler.running] == sorted(
        r.admit_seq for r in scheduler.running)
    gpu_owners, swap_owners = Counter(), Counter()
    for request in scheduler.requests.values():
        tokens = request.all_token_ids
        assert len(request.block_ids) == len(set(request.block_ids))
        gpu_owners.update(request.block_ids)
        swap_owners.update(request.cpu_block_ids)
        assert request.fork_children == [] or request.output_token_ids == []
        # Prefix hashes name this request's own tokens, block by block.
        parent = None
        for index, block_hash in enumerate(request.block_hashes):
            parent = chain_hash(parent, tokens[index * size:(index + 1) * size])
            assert block_hash == parent, f"{request}: stale hash of block {index}"
        if request.status is not RequestStatus.RUNNING:
            assert not request.block_ids, f"{request} holds GPU blocks"
        if request.status is not RequestStatus.SWAPPED:
            assert not request.cpu_block_ids, f"{request} holds swap blocks"
        if request.status in (RequestStatus.WAITING, RequestStatus.FORKING):
            assert request.num_computed_tokens == 0 and not request.on_executor
        if request.status is RequestStatus.SWAPPED:
            assert not request.on_executor
            executor.check_context(tokens, request.cpu_block_ids, request.num_computed_tokens,
                                   swap=True, what=f"swapped {request}")
        if request.status is RequestStatus.RUNNING:
            assert request.num_computed_tokens <= len(tokens)
            assert len(request.block_ids) * size >= request.num_computed_tokens
            assert len(request.block_ids) <= -(-len(tokens) // size)
            if request.on_executor:
                held = executor.requests[request.handle]
                assert held.blocks == request.block_ids
                assert held.tokens == tokens and held.computed == request.num_computed_tokens
                executor.check_context(tokens, request.block_ids, request.num_computed_tokens,
                                       what=f"running {request}")
    check_pool(scheduler.pool, gpu_owners, "GPU")
    check_pool(scheduler.swap_pool, swap_owners, "swap")
    assert scheduler.swap_pool.num_cached_free == 0 and not scheduler.swap_pool._cached
    if not config.enable_prefix_caching:
        assert not scheduler.pool._cached
    # A block the prefix cache names holds the KV of the tokens its hash names.
    for block_hash, block_id in scheduler.pool._cached.items():
        assert executor.block_contents(block_id) == driver.block_contents[block_hash], (
            f"cached block {block_id} holds {executor.block_contents(block_id)}")
    on_executor = {r.handle for r in scheduler.requests.values() if r.on_executor}
    assert on_executor <= executor.requests.keys()


# ---- the state machine ------------------------------------------------------------------


class SchedulerMachine(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.driver: Driver | None = None
        self.count = 0

    @initialize(config=configs())
    def start(self, config):
        self.driver = Driver(config)

    @rule(arrivals=st.lists(st.tuples(
        st.sampled_from(range(len(PREFIXES) + 1)), st.integers(0, 24),
        st.lists(st.integers(0, VOCAB - 1), max_size=12), st.integers(1, 3),
        st.integers(1, 16)), min_size=1, max_size=3))
    def add(self, arrivals):
        """A burst of requests: a shared prefix (or none), a tail, n and max_tokens each."""
        for prefix, prefix_len, tail, n, max_tokens in arrivals:
            prompt = (PREFIXES[prefix][:prefix_len] if prefix < len(PREFIXES) else []) + tail
            if not prompt:
                prompt = [prefix_len % VOCAB]
            request_id = f"r{self.count}"
            self.count += 1
            self.driver.add(request_id, prompt, SamplingParams(n=n, max_tokens=max_tokens))

    @precondition(lambda self: self.driver and self.driver.scheduler.requests)
    @rule(data=st.data(), whole=st.booleans())
    def abort(self, data, whole):
        scheduler = self.driver.scheduler
        if whole:
            request_id = data.draw(st.sampled_from(sorted(
                r.split("#")[0] for r in scheduler.requests)))
        else:
            request_id = data.draw(st.sampled_from(sorted(scheduler.requests)))
        self.driver.abort(request_id)

    @precondition(lambda self: self.driver and self.driver.scheduler.requests)
    @rule(data=st.data())
    def abort_in_flight(self, data):
        """An abort that arrives while a step is out: its result names a forgotten request."""
        def abort(driver):
            if driver.scheduler.requests:
                driver.abort(data.draw(st.sampled_from(sorted(driver.scheduler.requests))))
        self.driver.step(abort)

    @rule(request_id=st.sampled_from(["r0", "nobody", "r1#5"]))
    def abort_unknown(self, request_id):
        if not any(r == request_id or r.startswith(request_id + "#")
                   for r in self.driver.scheduler.requests):
            assert not self.driver.scheduler.abort_request(request_id)

    @rule(steps=st.integers(1, 6))
    def step(self, steps):
        for _ in range(steps):
            self.driver.step()

    @invariant()
    def consistent(self):
        if self.driver is not None:
            check_scheduler(self.driver)

    def teardown(self):
        if self.driver is None:
            return
        # No request waits forever: with no new arrivals everything finishes, then every
        # block of both pools is free (cached-free counts as free).
        self.driver.drain()
        check_scheduler(self.driver)
        self.driver.assert_idle()
        for name, count in self.driver.scheduler.counters.items():
            if count and name != "prefix_cache_queries":
                event(name)   # see --hypothesis-show-statistics


TestScheduler = SchedulerMachine.TestCase
TestScheduler.settings = settings(max_examples=300, stateful_step_count=60, deadline=None)


# ---- fixed cases ------------------------------------------------------------------------


def _workload(driver: Driver, count: int, steps_between: int = 1) -> None:
    for i in range(count):
        prefix = PREFIXES[i % len(PREFIXES)][:8 + 4 * (i % 4)]
        tail = [(i * 13 + k) % VOCAB for k in range(i % 5)]
        driver.add(f"w{i}", prefix + tail, SamplingParams(n=1 + i % 3, max_tokens=6 + i % 9))
        for _ in range(steps_between):
            driver.step()
        check_scheduler(driver)
    driver.drain()
    check_scheduler(driver)
    driver.assert_idle()


def test_every_mechanism_fires():
    """A fixed workload under auto preemption with a small swap pool: prefix hits, forks,
    and preemptions both ways all happen, and outputs match runs alone."""
    config = SchedulerConfig(num_kv_blocks=12, block_size=4, max_num_seqs=6,
                             max_num_batched_tokens=16, max_model_len=MAX_MODEL_LEN,
                             eos_token_ids=(EOS,), vocab_size=VOCAB, preemption_mode="auto",
                             num_swap_blocks=6, bytes_per_block=1, swap_bytes_per_s=1.0,
                             prefill_tokens_per_s=1.0)
    driver = Driver(config)
    _workload(driver, 24)
    stats = driver.scheduler.stats()
    assert stats["prefix_cache_hits"] > 0
    assert stats["forks"] > 0
    assert stats["preemptions_swap"] > 0
    assert stats["preemptions_recompute"] > 0
    assert stats["kv_blocks_cached"] > 0


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


def _burst_config(**changes) -> SchedulerConfig:
    return SchedulerConfig(**{**dict(
        num_kv_blocks=64, block_size=4, max_num_seqs=8, max_num_batched_tokens=256,
        max_model_len=MAX_MODEL_LEN, eos_token_ids=(EOS,), vocab_size=VOCAB), **changes})


def test_burst_shares_blocks_scheduled_in_the_same_step():
    """Five requests with a 20-token common prefix, admitted in one step: the last four take
    the first one's five blocks at once (the fake executor writes every row before checking
    what each row attends to, as the real one does per layer)."""
    driver = Driver(_burst_config())
    for i in range(5):
        driver.add(f"b{i}", PREFIXES[0][:20] + [i, i + 1], SamplingParams(max_tokens=6))
    driver.step()
    assert driver.scheduler.stats()["prefix_cache_hits"] == 4 * 20
    assert len(driver.scheduler.running) == 5
    check_scheduler(driver)
    driver.drain()
    driver.assert_idle()


def test_a_failed_step_leaves_no_registered_block_to_find():
    prompt = PREFIXES[1][:20] + [9]
    params = SamplingParams(max_tokens=4)
    for failed in (False, True):
        scheduler = Scheduler(_burst_config())
        scheduler.add_request("a", prompt, params)
        scheduler.schedule()                 # registers a's five full blocks
        if failed:
            scheduler.discard_unconfirmed()  # ... but the step never ran
        scheduler.abort_request("a")
        scheduler.add_request("b", prompt, params)
        (new,) = scheduler.schedule().new_requests
        assert new.num_computed_tokens == (0 if failed else 20)
        if failed:
            assert scheduler.pool.num_cached_free == 0
