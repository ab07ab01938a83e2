"""Who is admitted first (scheduler/fairness/, docs/serving.md "Who goes first"), on the
real Scheduler with the fake executor, counted in steps (deterministic):

- a request the LoRA slot limit holds back lets later requests that fit pass, but only
  max_num_seqs of them: then its adapter gets its turn (not starved);
- under the priority policy a waiting request's class improves with the steps it waited:
  a steady stream of urgent requests holds a less urgent one back for a bounded number of
  steps (for ever without aging);
- clients take turns within a priority: one client's long queue does not stand in front of
  another client's first request."""

from __future__ import annotations

from folio.shared.config import SchedulerConfig
from folio.shared.sampling_params import SamplingParams
from tests.scheduler.test_scheduler_properties import (EOS, MAX_MODEL_LEN, VOCAB, Driver,
                                                       expected_outputs)


def _config(**changes) -> SchedulerConfig:
    return SchedulerConfig(**{**dict(
        num_kv_blocks=256, block_size=4, max_num_seqs=4, max_num_batched_tokens=256,
        max_model_len=MAX_MODEL_LEN, eos_token_ids=(EOS,), vocab_size=VOCAB), **changes})


def _params(max_tokens: int, **more) -> SamplingParams:
    return SamplingParams(max_tokens=max_tokens, **more)


def _runs_to_length(max_tokens: int, start: int) -> list[int]:
    """A prompt the fake executor answers without EOS for max_tokens tokens."""
    for k in range(start, start + 1000):
        prompt = [k % VOCAB, (3 * k + 1) % VOCAB, 7]
        if expected_outputs(prompt, _params(max_tokens), MAX_MODEL_LEN)[1] == "length":
            return prompt
    raise AssertionError("no such prompt")


class _Driver(Driver):
    """Keeps every request it added, to read their admission order at the end."""

    def __init__(self, config: SchedulerConfig) -> None:
        super().__init__(config)
        self.added: list = []

    def add(self, request_id, prompt, sampling, client=None) -> bool:
        added = super().add(request_id, prompt, sampling, client)
        self.added.append(self.scheduler.requests[request_id])
        return added


def _admitted(driver: _Driver) -> list[str]:
    """Request ids in the order they were first admitted."""
    seen = [r for r in driver.added if r.admit_seq >= 0]
    return [r.request_id for r in sorted(seen, key=lambda r: r.admit_seq)]


def test_a_request_blocked_by_the_lora_limit_lets_fitting_ones_pass_but_gets_its_turn():
    driver = _Driver(_config(max_loras=1, loras=("a", "b"), max_num_seqs=8))
    driver.add("long-a", _runs_to_length(30, 1), _params(30, lora="a"))
    driver.step()
    driver.add("b", [4, 5, 6], _params(2, lora="b"))   # a second adapter: held back
    driver.add("base", [7, 8, 9], _params(2))
    driver.add("a2", [9, 8, 7], _params(2, lora="a"))
    driver.step()
    running = {r.request_id for r in driver.scheduler.running}
    assert {"base", "a2"} <= running and "b" not in running   # they did not wait behind b
    # A steady stream of adapter-a requests: after max_num_seqs have passed b, the queue
    # waits at b; a's requests drain and b runs before the later ones.
    for i in range(20):
        driver.add(f"more{i}", [i + 10, 11, 12], _params(2, lora="a"))
        driver.step()
    driver.drain()
    driver.assert_idle()
    order = _admitted(driver)
    assert order.index("b") < order.index("more19")
    passed = [rid for rid in order[:order.index("b")] if rid != "long-a"]
    assert len(passed) == 8   # max_num_seqs requests passed it, no more
    assert "b" in driver.finished and not driver.scheduler.requests


def _urgent_stream(aging_steps: int, steps: int) -> list[str]:
    driver = _Driver(_config(scheduling_policy="priority", max_num_seqs=1,
                            priority_aging_steps=aging_steps))
    driver.add("bystander", [1, 2, 3], _params(2, priority=5))
    for i in range(steps):   # one urgent request per step, each needing two
        driver.add(f"urgent{i}", [i % 50 + 5, 6, 7], _params(2, priority=0))
        driver.step()
    return _admitted(driver)


def test_aging_bounds_how_long_urgent_traffic_holds_a_request_back():
    assert "bystander" not in _urgent_stream(aging_steps=0, steps=80)   # the finding
    order = _urgent_stream(aging_steps=4, steps=80)
    # Priority 5, one class per 4 steps: ordered like a priority-0 arrival ~20 steps later.
    assert "bystander" in order
    # urgent{i} arrives at step i: only those that arrived before its class was passed,
    # (5 + 1) * 4 steps, went first; everyone arriving later waits behind it.
    before = order[:order.index("bystander")]
    assert max(int(rid.removeprefix("urgent")) for rid in before) < (5 + 1) * 4
    assert len(order) > len(before) + 1   # later urgent ones ran after it


def test_clients_take_turns_within_a_class():
    for clients in (True, False):
        driver = _Driver(_config(max_num_seqs=2))
        for i in range(40):
            driver.add(f"heavy{i}", [i % 50 + 5, 6, 7], _params(3),
                       client="heavy" if clients else None)
        driver.step()
        driver.add("light", [1, 2, 3], _params(3), client="light" if clients else None)
        driver.drain()
        driver.assert_idle()
        order = _admitted(driver)
        if clients:   # it starts now: only requests already due go before it
            assert order.index("light") <= 4
        else:         # one anonymous client: FCFS, behind all 40
            assert order.index("light") == 40


def test_a_client_alone_is_served_in_arrival_order_under_both_policies():
    for policy in ("fcfs", "priority"):
        driver = _Driver(_config(max_num_seqs=1, scheduling_policy=policy))
        for i in range(6):
            driver.add(f"r{i}", [i + 5, 6, 7], _params(2), client="only")
        driver.drain()
        assert _admitted(driver) == [f"r{i}" for i in range(6)]


def test_one_clients_backlog_keeps_its_priorities():
    """A client's own backlog is not 'in the future' for its other priorities: a more urgent
    request of it goes first, a less urgent one after the backlog (aging is far off)."""
    driver = _Driver(_config(max_num_seqs=2, scheduling_policy="priority"))
    for i in range(20):
        driver.add(f"p0-{i}", [i + 5, 6, 7], _params(2), client="one")
    driver.add("later", [1, 2, 3], _params(2, priority=1), client="one")
    driver.add("urgent", [4, 5, 6], _params(2, priority=-1), client="one")
    driver.drain()
    order = _admitted(driver)
    assert order[0] == "urgent" and order[-1] == "later", order
