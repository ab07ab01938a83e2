"""A hybrid model's recurrent state slots in the scheduler's one accounting: admission waits
for a slot as for blocks, recompute preemption and finishing free it, swap preemption moves
the state to a host slot and back with the blocks (recompute when no host slot is free),
forks are not used, and the page map, stats and wire message show the slots."""

from __future__ import annotations

from folio.scheduler.preemption import should_swap
from folio.scheduler.scheduler import Scheduler
from folio.shared.config import SchedulerConfig
from folio.shared.protocol import messages as m
from folio.shared.protocol.wire import Body, unpack
from folio.shared.sampling_params import SamplingParams
from tests.fake_executor import FakeExecutor


def _hybrid(**overrides) -> tuple[Scheduler, FakeExecutor]:
    fields = dict(num_kv_blocks=32, block_size=4, max_num_seqs=8, max_num_batched_tokens=64,
                  max_model_len=32, num_state_slots=2, state_bytes=1000,
                  num_swap_blocks=16, preemption_mode="swap", enable_prefix_caching=True)
    fields.update(overrides)
    config = SchedulerConfig(**fields)
    return Scheduler(config), FakeExecutor(4, config.num_kv_blocks, config.num_swap_blocks,
                                           state_slots=config.num_state_slots,
                                           swap_state_slots=config.num_swap_state_slots)


def _step(scheduler, executor):
    plan = scheduler.schedule()
    scheduler.update(plan, executor.execute(plan))
    return plan


def test_admission_waits_for_a_slot_and_the_map_shows_them():
    scheduler, executor = _hybrid()
    for i in range(3):   # blocks for all three, slots for two
        scheduler.add_request(f"r{i}", [5, 6, 7, 8, 9], SamplingParams(max_tokens=6))
    plan = _step(scheduler, executor)
    assert sorted(new.state_slot for new in plan.new_requests) == [0, 1]
    assert len(scheduler.running) == 2 and len(scheduler.waiting) == 1
    stats = scheduler.stats()
    assert (stats["state_slots_total"], stats["state_slots_used"]) == (2, 2)
    snapshot = scheduler.kv_map()
    assert snapshot["state_slots"]["slot_bytes"] == 1000
    holders = snapshot["state_slots"]["owner"]
    assert sorted(holders) == [0, 1]   # the two running requests, by index
    assert [snapshot["requests"][i]["state_slot"] for i in holders] == [0, 1]
    assert "state_slot" not in snapshot["requests"][2]   # the waiting one holds none
    # The map and the stats survive the wire's checks.
    decoded = m.decode_kv_map(Body("kv_map", unpack(m.encode_kv_map(snapshot))[1]))
    assert decoded["state_slots"] == snapshot["state_slots"]
    while scheduler.has_unfinished_requests():
        _step(scheduler, executor)
    _step(scheduler, executor)
    assert scheduler.stats()["state_slots_used"] == 0
    assert scheduler.kv.states.num_free == 2
    assert scheduler.stats()["prefix_cache_hits"] == 0   # off for a hybrid


def test_preemption_recomputes_and_frees_the_slot():
    # 4 blocks of 4 tokens: two requests that grow past 8 tokens each cannot both run.
    scheduler, executor = _hybrid(num_kv_blocks=4)
    assert not should_swap(scheduler.config, 100, 1, 16)   # swap mode, no host state slot
    for i in range(2):
        scheduler.add_request(f"r{i}", [5, 6, 7, 8, 9, 10], SamplingParams(max_tokens=8))
    while scheduler.has_unfinished_requests():
        _step(scheduler, executor)
        assert scheduler.kv.states.num_used == len(scheduler.running)
    stats = scheduler.stats()
    assert stats["preemptions_recompute"] > 0 and stats["preemptions_swap"] == 0
    _step(scheduler, executor)
    assert scheduler.kv.states.num_free == 2


def test_n_samples_compute_their_prompts_in_their_own_slots():
    scheduler, executor = _hybrid()
    scheduler.add_request("n", [5, 6, 7, 8, 9], SamplingParams(max_tokens=3, n=2))
    slots = []
    while scheduler.has_unfinished_requests():
        plan = _step(scheduler, executor)
        slots += [(new.state_slot, new.num_computed_tokens) for new in plan.new_requests]
    assert scheduler.stats()["forks"] == 0
    assert sorted(slots) == [(0, 0), (1, 0)]   # both from position 0, in distinct slots


def test_swap_moves_the_state_with_the_blocks():
    """One host state slot for three requests that cannot all run: a swapped-out request's
    state goes to the host slot and comes back into a device slot (the fake executor checks
    every request resumes from its own state); a preemption while the host slot holds a
    state recomputes."""
    scheduler, executor = _hybrid(num_kv_blocks=6, num_state_slots=3,
                                  num_swap_state_slots=1, enable_prefix_caching=False)
    for i in range(3):
        scheduler.add_request(f"r{i}", [5, 6, 7, 8, 9, 10], SamplingParams(max_tokens=10))
    moved_out = moved_in = 0
    while scheduler.has_unfinished_requests():
        plan = _step(scheduler, executor)
        moved_out += len(plan.state_swap_out)
        moved_in += len(plan.state_swap_in)
        if plan.state_swap_out:   # with the blocks, in the same plan
            assert plan.swap_out
        if plan.state_swap_out or plan.state_swap_in:   # the moves cross the wire
            decoded = m.decode_plan(Body("plan", unpack(m.encode_plan(plan))[1]))
            assert (decoded.state_swap_out, decoded.state_swap_in) == (
                plan.state_swap_out, plan.state_swap_in)
        kv = scheduler.kv
        assert kv.states.num_used == len(scheduler.running)
        assert kv.num_free_swap_state_slots == 1 - len(scheduler.swapped)
    stats = scheduler.stats()
    assert stats["preemptions_swap"] == moved_out == moved_in > 0
    assert stats["preemptions_recompute"] > 0
    _step(scheduler, executor)
    assert scheduler.kv.states.num_free == 3 and not executor.host_states
    assert (stats["swap_state_slots_total"], stats["swap_state_slots_free"]) == (1, 1)
    assert scheduler.swap_pool.num_free == scheduler.config.num_swap_blocks


def test_no_free_host_state_slot_recomputes():
    scheduler, _ = _hybrid(num_swap_state_slots=1)
    config = scheduler.config
    assert should_swap(config, 100, 1, 16, free_swap_state_slots=1)
    assert not should_swap(config, 100, 1, 16, free_swap_state_slots=0)


def test_host_state_slots_reach_the_wire_and_prometheus():
    from folio.frontend.metrics import Metrics

    scheduler, executor = _hybrid(num_kv_blocks=6, num_state_slots=3,
                                  num_swap_state_slots=1, enable_prefix_caching=False)
    for i in range(3):
        scheduler.add_request(f"r{i}", [5, 6, 7, 8, 9, 10], SamplingParams(max_tokens=10))
    while not scheduler.swapped:   # until a request waits swapped out
        _step(scheduler, executor)
    stats = scheduler.stats()
    assert (stats["swap_state_slots_total"], stats["swap_state_slots_free"]) == (1, 0)
    decoded = m.decode_stats(Body("stats", unpack(m.encode_stats(stats))[1]))
    assert decoded["swap_state_slots_free"] == 0
    # The page map names the host slot of the swapped-out request, and of no other.
    snapshot = m.decode_kv_map(Body("kv_map", unpack(m.encode_kv_map(scheduler.kv_map()))[1]))
    swapped = [r for r in snapshot["requests"] if r["state"] == "swapped"]
    assert [r.get("swap_state_slot") for r in swapped] == [0]
    assert all("swap_state_slot" not in r for r in snapshot["requests"] if r not in swapped)
    assert "folio:swap_state_slots_used 1.0" in Metrics("m").render(decoded).decode()


def test_a_request_with_drafts_in_flight_is_recomputed_not_swapped():
    """One step ahead, a step in flight may accept drafts the scheduler does not count
    once the request is preempted: a swapped state would already hold them and they
    would be fed again. Such a request is recomputed; without drafts in flight it swaps."""
    import json

    from folio.shared.protocol.step import StepPlan

    spec = json.dumps({"method": "ngram", "num_speculative_tokens": 2})
    scheduler, executor = _hybrid(num_swap_state_slots=2, speculative_config=spec,
                                  enable_prefix_caching=False)
    scheduler.add_request("a", [5, 6, 7, 5, 6], SamplingParams(max_tokens=8))
    scheduler.add_request("b", [5, 6, 7, 5, 6], SamplingParams(max_tokens=8))
    _step(scheduler, executor)   # the prompts
    in_flight = scheduler.schedule()   # decode steps that may carry drafts, not yet run
    a, b = scheduler.requests["a"], scheduler.requests["b"]
    assert in_flight.drafts and a.num_draft_slots > 0
    plan = StepPlan(step_id=in_flight.step_id + 1)
    scheduler._preempt(a, plan)
    assert a in scheduler.waiting and not scheduler.kv.take_state_swaps()[0]
    b.num_draft_slots = 0   # as if its step had carried none
    b.draft_steps.clear()
    scheduler._preempt(b, plan)
    assert b in scheduler.swapped and len(scheduler.kv.take_state_swaps()[0]) == 1


def test_the_executor_hello_carries_the_host_state_slots():
    from folio.shared.config import ExecutorCapacity

    capacity = ExecutorCapacity(num_kv_blocks=8, block_size=16, max_model_len=256,
                                vocab_size=1024, eos_token_ids=(0,), num_state_slots=4,
                                state_bytes=100, num_swap_state_slots=3)
    kind, body = unpack(m.encode_hello_executor(capacity, 1))
    received = m.decode_hello_executor(Body(kind, body)).capacity
    config = SchedulerConfig.from_engine(SchedulerConfig(num_kv_blocks=8, block_size=16,
                                                         max_model_len=256), received)
    assert config.num_swap_state_slots == 3
