"""Property-based tests of the block pools and the scheduler against a fake executor.

Each example steps serially (plan, result, plan...) or one step ahead, as the scheduler
process does with async scheduling: plan N+1 is made before result N is applied, and the
fake executor runs the plans in order, appending its own samples.
Random arrivals (prompts built from a few shared prefixes, n in {1, 2, 3}), aborts, steps,
under config variants drawn once per example (block size, pool sizes, chunked prefill,
prefix caching, recompute / swap / auto preemption, a sliding window or none, or a hybrid
model's recurrent state slots beside the blocks). After every
rule each block of the GPU pool and of the swap pool is in exactly one state with the right
reference count (the null block of a sliding-window pool in none), and the fake executor's
KV contents agree with what the scheduler believes for every position still in a window. At the end every request
finishes within a bounded number of steps with the tokens it would have had alone, and both
pools are entirely free.
"""

from __future__ import annotations

import json
from collections import Counter, deque

import pytest
from hypothesis import event, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

from folio.scheduler.kv.block_pool import BlockPool, chain_hash
from folio.scheduler.kv.block_table import NEVER
from folio.scheduler.kv_events import KVEventLog
from folio.scheduler.request import RequestStatus
from folio.scheduler.scheduler import Scheduler
from folio.shared.outputs import child_request_id
from folio.shared.config import SchedulerConfig
from folio.shared.outputs import EngineOutput, FinishReason
from folio.shared.sampling_params import SamplingParams
from tests.fake_executor import FakeExecutor, extend_digests, sample

VOCAB = 64
EOS = 3
MAX_MODEL_LEN = 40
PREFIXES = [[(7 * i + 5 * k) % VOCAB for i in range(24)] for k in range(1, 4)]


SPEC_K1 = json.dumps({"num_speculative_tokens": 1, "max_running": 64})
SPEC_K3 = json.dumps({"method": "suffix", "num_speculative_tokens": 3, "max_running": 64,
                      "acceptance_window": 6, "min_acceptance": 0.5, "cooldown_steps": 2})


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
    # Every layer windowed (the scheduler frees blocks behind the window), or not.
    sliding_window = draw(st.sampled_from([None, None, 1, 3, 6, 13, 39]))
    # A hybrid model (scheduler/kv/state_slots.py): one recurrent state slot per admitted
    # request, fewer slots than seats or more; its full-attention layers have no window.
    # Host state slots for swap preemption: none (recompute), fewer than seats, or more.
    state_slots = draw(st.sampled_from([0, 0, 0, 1, 3, 8]))
    hybrid = {"num_state_slots": state_slots, "state_bytes": 7, "sliding_window": None,
              "num_swap_state_slots": draw(st.sampled_from([0, 1, 4])),
              # prefix hits resume from state checkpoints
              "hybrid_checkpoint_blocks": draw(st.sampled_from([0, 1, 2, 4]))
              } if state_slots else {}
    return SchedulerConfig(**{**dict(
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
        sliding_window=sliding_window,
        scheduling_policy=draw(st.sampled_from(["fcfs", "priority"])),
        # Speculative decoding: the fake executor's drafts are partly right (docs/
        # spec_decode.md); a sliding window turns it off.
        speculative_config=draw(st.sampled_from([None, None, SPEC_K1, SPEC_K3])),
    ), **hybrid})


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
    """A scheduler and a fake executor stepping together; records every output. With
    `ahead`, one plan is always made before the previous step's result is applied."""

    def __init__(self, config: SchedulerConfig, ahead: bool = False) -> None:
        self.config = config
        self.ahead = ahead
        self.sent: deque = deque()       # plans the fake executor has not run yet
        self.inflight: deque = deque()   # those of them whose results are due
        self.executed: list = []          # every plan the fake executor ran, in order
        self.seen: dict[int, object] = {}   # handle -> Request, to note its block contents
        # Every prefix-cache change as a KV event (vLLM's format): a subscriber's view of
        # the cache, rebuilt from them alone, must be the pool's (check_kv_events).
        self.kv_events = KVEventLog(config.block_size)
        self.subscriber_view: set[bytes] = set()
        self.scheduler = Scheduler(config, self.kv_events)
        self.executor = FakeExecutor(config.block_size, config.num_kv_blocks,
                                     config.num_swap_blocks, VOCAB, config.sliding_window,
                                     config.num_state_slots, config.num_swap_state_slots)
        self.expected: dict[str, tuple[list[int], str]] = {}   # by sample id
        self.emitted: dict[str, list[int]] = {}
        self.finished: dict[str, str] = {}
        self.aborted: set[str] = set()
        self.groups: dict[str, list[str]] = {}                  # request id -> sample ids
        # Prefix hash -> the fake KV its block must hold, for every full block ever known,
        # from each request's own tokens (hash chains by handle, extended as tokens come).
        self.block_contents: dict[bytes, list] = {}
        self.chains: dict[int, list[bytes]] = {}

    def add(self, request_id: str, prompt: list[int], sampling: SamplingParams,
            client: str | None = None) -> bool:
        limit = self.config.max_request_len
        never_fits = len(prompt) + (sampling.max_tokens or 0) > limit
        try:
            ids = self.scheduler.add_request(request_id, prompt, sampling, client)
        except ValueError:
            assert never_fits
            return False
        assert not never_fits
        assert ids == [child_request_id(request_id, i, sampling.n) for i in range(sampling.n)]
        expected = expected_outputs(prompt, sampling, self.config.max_request_len)
        for sample_id in ids:
            request = self.scheduler.requests[sample_id]
            self.seen[request.handle] = request
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
        """One result applied; `abort_in_flight(driver)` runs while its plan (and, ahead,
        the next one) is out."""
        if not self.inflight:
            self._send()
        if self.ahead and self.inflight:
            self._send()
        head = self.inflight[0] if self.inflight else None
        result = None
        while self.sent:
            plan = self.sent.popleft()
            outcome = self.executor.execute(plan)
            self.executed.append(plan)
            if plan is head:
                result = outcome
                break
        if abort_in_flight is not None and head is not None:
            abort_in_flight(self)
        if head is not None:
            self.inflight.popleft()
            for output in self.scheduler.update(head, result):
                self._record(output)
        self._note_block_contents()

    def _send(self) -> None:
        scheduler, config = self.scheduler, self.config
        plan = scheduler.schedule()
        assert plan.num_scheduled_tokens <= config.max_num_batched_tokens
        assert len(plan.new_requests) + len(plan.running_handles) <= config.max_num_seqs
        for output in scheduler.take_pending_outputs():
            self._record(output)
        if plan.is_empty and not plan.dropped_handles:
            return
        self.sent.append(plan)
        if not plan.is_empty:
            self.inflight.append(plan)

    def _note_block_contents(self) -> None:
        """The fake KV each block hash names, from the requests' own tokens."""
        size = self.config.block_size
        for handle, request in list(self.seen.items()):
            tokens = request.all_token_ids
            chain = self.chains.setdefault(handle, [])
            full = len(tokens) // size
            if len(chain) < full:
                digests = extend_digests([], tokens[:full * size])
                for index in range(len(chain), full):
                    positions = range(index * size, (index + 1) * size)
                    chain.append(chain_hash(chain[-1] if chain else None,
                                            tokens[index * size:(index + 1) * size]))
                    self.block_contents.setdefault(chain[-1], [(p, tokens[p], digests[p])
                                                               for p in positions])
            if request.status is RequestStatus.FINISHED:
                del self.seen[handle]
                del self.chains[handle]

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
        while self.scheduler.has_work() or self.sent:
            assert steps < limit, f"not idle after {steps} steps: {self.scheduler.stats()}"
            self.step()
            steps += 1
        return steps

    def assert_idle(self) -> None:
        scheduler = self.scheduler
        assert not scheduler.requests
        assert not (scheduler.running or scheduler.waiting or scheduler.swapped)
        assert scheduler.pool.num_free == scheduler.pool.num_usable
        assert scheduler.stats()["kv_blocks_free"] == scheduler.stats()["kv_blocks_total"]
        assert scheduler.swap_pool.num_free == scheduler.swap_pool.num_blocks
        assert scheduler.kv.states.num_free == self.config.num_state_slots   # every slot
        assert scheduler.kv.num_free_swap_state_slots == self.config.num_swap_state_slots
        assert not self.executor.requests, "executor still holds finished requests"
        assert not self.sent and not scheduler.kv.unconfirmed_blocks()
        assert not scheduler.kv.handles(), "the KV manager still holds finished requests"
        assert set(self.finished) == set(self.emitted), "a request never finished"


# ---- invariants -------------------------------------------------------------------------


def check_pool(pool: BlockPool, owners: Counter, name: str) -> None:
    """Each block free, cached-free or used, with as many references as holders; the null
    block (if any) in none of those states."""
    unreferenced = set(pool._unreferenced)
    cached_free = 0
    null = pool.null_block
    if null is not None:
        assert pool.ref_count(null) == 0 and pool.block_hash(null) is None
        assert null not in unreferenced and owners[null] == 0, f"{name} null block in use"
    for block_id in range(pool.num_blocks):
        if block_id == null:
            continue
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
    assert pool.num_free + pool.num_used == pool.num_usable
    assert pool.num_free == sum(1 for b in range(pool.num_blocks)
                                if pool.ref_count(b) == 0 and b != null)


def check_kv_events(driver: Driver) -> None:
    """The events since the last check, applied as a subscriber would, give exactly the set
    of hashes the pool can find; each stored block's hash is its parent's and tokens'."""
    view, size = driver.subscriber_view, driver.config.block_size
    for event in driver.kv_events.drain():
        if event[0] == "BlockStored":
            _, hashes, parent, tokens, block_size, _lora, _medium = event
            assert block_size == size and len(tokens) == size * len(hashes)
            for index, block_hash in enumerate(hashes):
                assert chain_hash(parent, tokens[index * size:(index + 1) * size]) == block_hash
                assert block_hash not in view
                view.add(block_hash)
                parent = block_hash
        elif event[0] == "BlockRemoved":
            for block_hash in event[1]:
                view.remove(block_hash)
        else:
            assert event == ["AllBlocksCleared"]
            view.clear()
    pool = driver.scheduler.kv.pool
    findable = {pool.block_hash(b) for b in range(pool.num_blocks)} - {None}
    assert view == findable


def check_fifo_within_priority(driver: Driver) -> None:
    """No starvation within a class: of two single-sample requests of one priority, the one
    that arrived first was admitted first (the queue never lets a later one pass)."""
    admitted = sorted((r for r in driver.seen.values()
                       if r.admit_seq >= 0 and r.sampling.n == 1 and "#" not in r.request_id),
                      key=lambda r: r.handle)
    last: dict[int, int] = {}
    for request in admitted:
        priority = request.sampling.priority
        assert request.admit_seq > last.get(priority, -1), (
            f"{request.request_id} (priority {priority}) was admitted before an earlier one")
        last[priority] = request.admit_seq


def check_state_slots(scheduler, config, statuses) -> None:
    """A hybrid's state slots: each running request holds exactly one of its own, no other
    request holds any (recompute and swap-out free it; never forked), and the slot pool's
    counts agree."""
    kv = scheduler.kv
    held = {r.handle: kv.state_slot(r) for r in scheduler.requests.values()}
    if not config.num_state_slots:
        assert set(held.values()) <= {-1} and not kv.states.enabled
        return
    running = {r.handle for r in statuses[RequestStatus.RUNNING]}
    assert all((slot >= 0) == (handle in running) for handle, slot in held.items()), held
    slots = [slot for slot in held.values() if slot >= 0]
    assert len(slots) == len(set(slots)) == kv.states.num_used <= config.num_state_slots
    assert kv.states.owners() == {slot: h for h, slot in held.items() if slot >= 0}
    checkpoints = kv.states.checkpoint_slots()
    assert len(set(checkpoints)) == len(checkpoints) and not set(checkpoints) & set(slots)
    assert len(slots) + len(checkpoints) <= config.num_state_slots
    # Each swapped-out request's state waits in a host slot of its own.
    swapped = len(statuses[RequestStatus.SWAPPED])
    assert swapped + kv.num_free_swap_state_slots == config.num_swap_state_slots


def check_scheduler(driver: Driver) -> None:
    check_kv_events(driver)
    scheduler, config, executor = driver.scheduler, driver.config, driver.executor
    size = config.block_size
    # What the plans not yet run will do: the fake executor lags the scheduler by them.
    ahead_tokens: Counter = Counter()
    ahead_blocks: dict[int, list[int]] = {}
    ahead_new: set[int] = set()
    ahead_swap_out: set[int] = set()
    for plan in driver.sent:
        ahead_tokens.update(dict(zip(plan.running_handles, plan.running_num_tokens)))
        for handle, blocks in plan.new_block_ids.items():
            ahead_blocks.setdefault(handle, []).extend(blocks)
        ahead_new.update(new.handle for new in plan.new_requests)
        ahead_swap_out.update(dst for _, dst in plan.swap_out)
    unconfirmed = scheduler.kv.unconfirmed_blocks()
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
    check_state_slots(scheduler, config, statuses)
    # Oldest first; by priority first under the priority policy (victims from the tail).
    by_priority = config.scheduling_policy == "priority"
    order = [(r.queue_key[:2] if by_priority else (0, 0), r.admit_seq)
             for r in scheduler.running]
    assert order == sorted(order)
    for queue in (scheduler.waiting, scheduler.swapped):   # (class, client round, arrival)
        keys = [r.queue_key for r in queue]
        assert keys == sorted(keys)
    gpu_owners, swap_owners = Counter(), Counter()
    null = scheduler.pool.null_block
    kv = scheduler.kv
    # The manager keeps nothing for a request that finished.
    assert kv.handles() <= {r.handle for r in scheduler.requests.values()}
    for request in scheduler.requests.values():
        tokens = request.all_token_ids
        # The tables, asked of the manager that holds them.
        block_ids = kv.block_ids(request)
        cpu_block_ids = kv.swap_block_ids(request)
        freed = kv.num_freed_blocks(request)
        live = block_ids[freed:]
        # Freed entries are the leading ones and name the null block; the rest are distinct.
        # (A swapped request keeps its count for swap-in, without a table.)
        if request.status is not RequestStatus.SWAPPED:
            assert block_ids[:freed] == [null] * freed, request
        assert null not in live and len(live) == len(set(live)), request
        if config.sliding_window is None:
            assert freed == 0
        else:
            assert len(live) <= config.window_peak_blocks, request
        if request.status is RequestStatus.RUNNING:
            assert kv.num_live_blocks(request) == len(live), request
        gpu_owners.update(live)
        swap_owners.update(cpu_block_ids)
        assert request.fork_children == [] or request.output_token_ids == []
        # The counts cached for the per-step loops (scheduler/request.py) match what they
        # cache, through preemption, swaps, forks, prefix hits, windows and failed steps.
        assert request.prompt_len == len(request.prompt_token_ids), request
        assert request.num_tokens == len(tokens), request
        assert request.stop_num_tokens == request.prompt_len + request.stop_length_at
        # So do the manager's (scheduler/kv/block_table.py), read in its own rows: nothing
        # outside it reads them.
        row = kv._tables.get(request.handle)
        if request.status is RequestStatus.RUNNING:
            assert row is not None, request
        if row is not None:
            assert row.block_ids == block_ids and row.cpu_block_ids == cpu_block_ids
            assert row.num_slots == len(row.block_ids) * size, request
            assert 0 <= row.num_registered <= len(row.block_ids), request
            if not scheduler.kv.prefix.enabled:
                assert row.register_at == NEVER, request
            else:
                assert row.register_at == (row.num_registered + 1) * size, request
            assert row.work_at == (0 if config.sliding_window is not None
                                   else min(row.num_slots + 1, row.register_at)), request
        # Prefix hashes name this request's own tokens, block by block.
        parent = None
        for index, block_hash in enumerate(kv.block_hashes(request)):
            parent = chain_hash(parent, tokens[index * size:(index + 1) * size])
            assert block_hash == parent, f"{request}: stale hash of block {index}"
        if request.status is not RequestStatus.RUNNING:
            assert not block_ids, f"{request} holds GPU blocks"
        if request.status is not RequestStatus.SWAPPED:
            assert not cpu_block_ids, f"{request} holds swap blocks"
        if request.status in (RequestStatus.WAITING, RequestStatus.FORKING):
            assert request.num_computed_tokens == 0 and not request.on_executor
        assert request.num_pending >= 0
        if request.status is RequestStatus.SWAPPED:
            assert not request.on_executor
            if not ahead_swap_out & set(cpu_block_ids):   # its swap-out has run
                executor.check_context(tokens, cpu_block_ids,
                                       request.num_computed_tokens, swap=True,
                                       what=f"swapped {request}", first=freed * size,
                                       first_block=freed)
        if request.status is RequestStatus.RUNNING:
            assert request.num_computed_tokens <= len(tokens)
            assert len(block_ids) * size >= request.num_computed_tokens
            # Speculative drafts' slots stay in the table until the request needs them
            # (at most the drafts of the steps in flight and one step's more).
            slack = 0 if scheduler.drafts is None else \
                1 + 2 * scheduler.drafts.config.num_speculative_tokens
            assert len(block_ids) <= -(-(len(tokens) + slack) // size)
            if request.on_executor and request.handle not in ahead_new:
                held = executor.requests[request.handle]
                # The executor's table is append-only: entries freed since it was sent still
                # name their old blocks there, and no query reads them.
                table = held.blocks + ahead_blocks.get(request.handle, [])
                assert table[freed:] == live and len(table) == len(block_ids)
                assert held.tokens == tokens
                assert held.computed + ahead_tokens[request.handle] == \
                    request.num_computed_tokens
                executor.check_context(tokens, held.blocks, held.computed,
                                       what=f"running {request}",
                                       first=executor.first_read(held.computed))
    check_pool(scheduler.pool, gpu_owners, "GPU")
    check_pool(scheduler.swap_pool, swap_owners, "swap")
    assert scheduler.swap_pool.num_cached_free == 0 and not scheduler.swap_pool._cached
    if not scheduler.kv.prefix.enabled:
        assert not scheduler.pool._cached
    # A block the prefix cache names holds the KV of the tokens its hash names.
    for block_hash, block_id in scheduler.pool._cached.items():
        if block_id in unconfirmed:
            continue   # its step has not run yet
        assert executor.block_contents(block_id) == driver.block_contents[block_hash], (
            f"cached block {block_id} holds {executor.block_contents(block_id)}")
    on_executor = {r.handle for r in scheduler.requests.values() if r.on_executor}
    assert on_executor - ahead_new <= executor.requests.keys()


# ---- the state machine ------------------------------------------------------------------


class SchedulerMachine(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.driver: Driver | None = None
        self.count = 0

    @initialize(config=configs(), ahead=st.booleans())
    def start(self, config, ahead):
        self.driver = Driver(config, ahead)

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
            # Under the priority policy, three classes spread over the arrivals.
            priority = (max_tokens + prefix_len) % 3 - 1 \
                if self.driver.config.scheduling_policy == "priority" else 0
            self.driver.add(request_id, prompt, SamplingParams(n=n, max_tokens=max_tokens,
                                                               priority=priority))

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
        check_fifo_within_priority(self.driver)
        for name, count in self.driver.scheduler.counters.items():
            if count and name != "prefix_cache_queries":
                event(name)   # see --hypothesis-show-statistics


TestScheduler = SchedulerMachine.TestCase
# The profile's examples (tests/conftest.py: 100 in the suite, 1000 with thorough), 60 steps each.
TestScheduler.settings = settings(settings.default, stateful_step_count=60)


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


@pytest.mark.parametrize("ahead", [False, True], ids=["serial", "one-step-ahead"])
def test_every_mechanism_fires(ahead):
    """A fixed workload under auto preemption with a small swap pool: prefix hits, forks,
    and preemptions both ways all happen, and outputs match runs alone (serially, and with
    each plan made before the previous result is applied)."""
    config = SchedulerConfig(num_kv_blocks=12, block_size=4, max_num_seqs=6,
                             max_num_batched_tokens=16, max_model_len=MAX_MODEL_LEN,
                             eos_token_ids=(EOS,), vocab_size=VOCAB, preemption_mode="auto",
                             num_swap_blocks=6, bytes_per_block=1, swap_bytes_per_s=1.0,
                             prefill_tokens_per_s=1.0)
    driver = Driver(config, ahead)
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


@pytest.mark.parametrize("ahead", [False, True], ids=["serial", "one-step-ahead"])
def test_burst_shares_blocks_scheduled_in_the_same_step(ahead):
    """Five requests with a 20-token common prefix, admitted in one step: the last four take
    the first one's five blocks at once (the fake executor writes every row before checking
    what each row attends to, as the real one does per layer)."""
    driver = Driver(_burst_config(), ahead)
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


def test_one_step_ahead_throws_away_the_step_after_a_stop():
    """A request whose token in step N is EOS was already scheduled in step N+1: that work
    is dropped, no token follows the EOS, and its blocks come back."""
    prompt = next(p for p in ([k, 2 * k % VOCAB] for k in range(1, VOCAB))
                  if expected_outputs(p, SamplingParams(max_tokens=30), MAX_MODEL_LEN)[1]
                  == FinishReason.STOP)
    expected, _ = expected_outputs(prompt, SamplingParams(max_tokens=30), MAX_MODEL_LEN)
    driver = Driver(_burst_config(), ahead=True)
    driver.add("s", prompt, SamplingParams(max_tokens=30))
    driver.drain()
    driver.assert_idle()
    assert driver.emitted["s"] == expected and driver.finished["s"] == FinishReason.STOP
    # One step per token, plus the one ahead of the EOS: it ran, its token was dropped.
    computing = [p for p in driver.executed
                 if p.running_handles == [0] or [n.handle for n in p.new_requests] == [0]]
    assert len(computing) == len(expected) + 1
    assert driver.executed[-1].dropped_handles == [0]


def test_one_step_ahead_skips_a_request_ending_by_length():
    """Nothing is scheduled past max_tokens: the step in flight samples the last token."""
    driver = Driver(_burst_config(), ahead=True)
    driver.add("m", [1, 2, 3], SamplingParams(max_tokens=1, ignore_eos=True))
    driver.step()   # sends the prompt; the plan ahead finds nothing to do
    assert driver.scheduler.stats()["steps"] == 2 and len(driver.sent) == 0
    assert driver.finished["m"] == FinishReason.LENGTH
    driver.drain()   # the forget notice
    driver.assert_idle()
    assert [len(p.new_requests) + len(p.running_handles) for p in driver.executed] == [1, 0]


# ---- sliding window ---------------------------------------------------------------------


def _window_config(**changes) -> SchedulerConfig:
    return SchedulerConfig(**{**dict(
        num_kv_blocks=8, block_size=4, max_num_seqs=4, max_num_batched_tokens=8,
        max_model_len=MAX_MODEL_LEN, eos_token_ids=(EOS,), vocab_size=VOCAB,
        sliding_window=6), **changes})


@pytest.mark.parametrize("ahead", [False, True], ids=["serial", "one-step-ahead"])
def test_window_serves_prompts_longer_than_the_pool(ahead):
    """7 usable blocks (28 tokens) and a window of 6: a request never holds more than
    window_peak_blocks = 5, so 36-token prompts run with the tokens they would have had
    alone, and the pool is all free when idle."""
    config = _window_config()
    assert config.window_peak_blocks == 5 and config.max_request_len == MAX_MODEL_LEN
    driver = Driver(config, ahead)
    freed = 0
    for i in range(4):
        prompt = [(11 * i + 3 * k) % VOCAB for k in range(30 + 2 * i)]
        assert len(prompt) > config.usable_kv_blocks * config.block_size or i < 2
        assert driver.add(f"long{i}", prompt, SamplingParams(max_tokens=4 + i % 3,
                                                             ignore_eos=True))
    while driver.scheduler.has_work() or driver.sent:
        driver.step()
        check_scheduler(driver)
        freed = max([freed] + [driver.scheduler.kv.num_freed_blocks(r)
                               for r in driver.scheduler.running])
    driver.assert_idle()
    assert freed >= 6                      # blocks behind the window went back as it moved
    stats = driver.scheduler.stats()
    assert stats["kv_blocks_total"] == 7 and stats["num_finished"] == 4


def test_window_peak_above_the_pool_keeps_the_cap():
    """Where one request's window and step could not fit the pool, the pool stays the cap."""
    config = _window_config(sliding_window=30, max_num_batched_tokens=16)
    assert config.window_peak_blocks == 13 > config.usable_kv_blocks
    assert config.max_request_len == 7 * 4
    scheduler = Scheduler(config)
    with pytest.raises(ValueError, match="capacity"):
        scheduler.add_request("x", [1] * 29, SamplingParams())


def test_a_model_with_a_global_layer_frees_nothing():
    """No sliding_window from the executor (some layer attends to everything): the table
    keeps every block, none is null, and the pool has no reserved block."""
    driver = Driver(_window_config(sliding_window=None, num_kv_blocks=16))
    driver.add("g", list(range(1, 30)), SamplingParams(max_tokens=6, ignore_eos=True))
    for _ in range(4):
        driver.step()
        check_scheduler(driver)
    (request,) = driver.scheduler.running
    table = driver.scheduler.kv.block_ids(request)
    assert driver.scheduler.kv.num_freed_blocks(request) == 0
    assert driver.scheduler.pool.null_block is None
    assert len(table) == len(set(table)) == 8
    driver.drain()
    driver.assert_idle()


@pytest.mark.parametrize("ahead", [False, True], ids=["serial", "one-step-ahead"])
def test_window_with_prefix_hits_forks_and_swaps(ahead):
    """The fixed workload of test_every_mechanism_fires with a window of 5: prefix hits
    (their blocks behind the window released at once), forks sharing only what the window
    reads, swaps moving only live blocks."""
    config = SchedulerConfig(num_kv_blocks=10, block_size=4, max_num_seqs=6,
                             max_num_batched_tokens=8, max_model_len=MAX_MODEL_LEN,
                             eos_token_ids=(EOS,), vocab_size=VOCAB, preemption_mode="auto",
                             num_swap_blocks=6, bytes_per_block=1, swap_bytes_per_s=1.0,
                             prefill_tokens_per_s=1.0, sliding_window=5)
    driver = Driver(config, ahead)
    _workload(driver, 24)
    stats = driver.scheduler.stats()
    assert stats["prefix_cache_hits"] > 0 and stats["forks"] > 0
    assert stats["preemptions_swap"] > 0


@pytest.mark.parametrize("ahead", [False, True], ids=["serial", "one-step-ahead"])
def test_window_prefix_hit_after_its_leading_blocks_were_evicted(ahead):
    """A prompt computed before is found again although its first blocks were evicted: a
    windowed hit needs only the blocks its first new token's window reads."""
    config = _window_config(enable_prefix_caching=True)
    driver = Driver(config, ahead)
    prompt = [(5 * k + 1) % VOCAB for k in range(28)]
    driver.add("a", prompt, SamplingParams(max_tokens=1))
    driver.drain()
    cached = driver.scheduler.pool.num_cached_free
    # Another prompt takes the least recently released blocks: a's first ones.
    driver.add("b", [(7 * k + 2) % VOCAB for k in range(9)], SamplingParams(max_tokens=1))
    driver.drain()
    assert driver.scheduler.pool.lookup(chain_hash(None, prompt[:4])) is None   # evicted
    assert driver.scheduler.pool.num_cached_free <= cached
    hits = driver.scheduler.stats()["prefix_cache_hits"]
    driver.add("c", prompt, SamplingParams(max_tokens=3))
    driver.step()
    (request,) = driver.scheduler.running
    # usable = 27 // 4 = 6 blocks; a hit of 6 needs blocks 4 and 5 (window 6 from position 24).
    assert driver.scheduler.stats()["prefix_cache_hits"] - hits == 24
    assert driver.scheduler.kv.num_freed_blocks(request) == 4 or ahead   # ahead: moved on
    check_scheduler(driver)
    driver.drain()
    driver.assert_idle()


def test_a_more_urgent_arrival_preempts_the_least_urgent_running_request():
    """Priority policy: two long requests of priority 1 fill the pool; one of priority 0
    arrives and is admitted at once by preempting the newer of them, which finishes later
    with the tokens it would have produced alone."""
    config = SchedulerConfig(num_kv_blocks=10, block_size=4, max_num_seqs=4,
                             max_num_batched_tokens=64, max_model_len=MAX_MODEL_LEN,
                             eos_token_ids=(EOS,), vocab_size=VOCAB, bytes_per_block=1,
                             swap_bytes_per_s=1.0, prefill_tokens_per_s=1.0,
                             scheduling_policy="priority")
    driver = Driver(config)
    for name, start in (("old", 10), ("new", 30)):
        driver.add(name, [(start + k) % VOCAB for k in range(16)],
                   SamplingParams(max_tokens=16, ignore_eos=True, priority=1))
    driver.step()
    assert [r.request_id for r in driver.scheduler.running] == ["old", "new"]
    driver.add("urgent", [(50 + k) % VOCAB for k in range(12)],
               SamplingParams(max_tokens=4, ignore_eos=True, priority=0))
    driver.step()
    running = [r.request_id for r in driver.scheduler.running]
    assert running[0] == "urgent" and "new" not in running and "old" in running
    assert driver.scheduler.stats()["preemptions_recompute"] == 1
    driver.drain()
    check_scheduler(driver)
    driver.assert_idle()   # every output as if alone (Driver checks), every block free


def test_fcfs_refuses_a_priority_by_name():
    config = SchedulerConfig(num_kv_blocks=10, block_size=4, max_num_seqs=4,
                             max_num_batched_tokens=64, max_model_len=MAX_MODEL_LEN,
                             eos_token_ids=(EOS,), vocab_size=VOCAB, bytes_per_block=1,
                             swap_bytes_per_s=1.0, prefill_tokens_per_s=1.0)
    with pytest.raises(ValueError, match="--scheduling-policy priority"):
        Scheduler(config).add_request("a", [1, 2], SamplingParams(priority=2))
