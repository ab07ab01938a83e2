"""The scheduler process in parts: each part of scheduler/service.py on its own (pure logic
with a fake clock, or over inproc:// ZeroMQ sockets), then the wired service driven turn by
turn with the fake executor answering its plans. No model, no processes, no ipc paths."""

from __future__ import annotations

import itertools
import time
import uuid

import pytest
import zmq

from folio.scheduler.admission import QueueLimits, queue_refusal
from folio.scheduler.executor_link import ExecutorLink, ExecutorTimeouts
from folio.scheduler.frontend_router import (FRONTEND_TIMEOUT_S, PARKED_SILENT_S,
                                             RESUME_WINDOW_S, FrontendRouter)
from folio.scheduler.reply_cache import CachedReply
from folio.scheduler.request_failure import fail_requests
from folio.scheduler.scheduler import Scheduler
from folio.scheduler.service import SchedulerService, SchedulerServiceConfig
from folio.scheduler.shutdown import ShutdownDrain
from folio.scheduler.steps_in_flight import StepsInFlight, awaits_result
from folio.shared.protocol import messages as m
from folio.shared.config import ExecutorCapacity, SchedulerConfig
from folio.shared.outputs import EngineOutput, FinishReason, StepOutputs
from folio.shared.sampling_params import SamplingParams
from folio.shared.protocol.step import StepPlan
from folio.shared.protocol.wire import unpack
from tests.fake_executor import FakeExecutor

CAPACITY = ExecutorCapacity(num_kv_blocks=32, block_size=16, max_model_len=256,
                            vocab_size=1024, eos_token_ids=())
GREEDY = SamplingParams(max_tokens=5, temperature=0)


class Clock:
    """A monotonic clock the test moves by hand."""

    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def _scheduler() -> Scheduler:
    return Scheduler(SchedulerConfig(num_kv_blocks=32, block_size=16, max_model_len=256,
                                     vocab_size=1024))


def _run_to_end(scheduler: Scheduler, fake: FakeExecutor) -> dict[str, list[int]]:
    """Step the scheduler against the fake executor, in process, until nothing is left."""
    tokens: dict[str, list[int]] = {}
    while scheduler.has_work():
        plan = scheduler.plan_for_executor()
        if plan is None:
            scheduler.take_pending_outputs()
            continue
        for output in scheduler.update(plan, fake.execute(plan)):
            tokens.setdefault(output.request_id, []).extend(output.new_token_ids)
    return tokens


# ---- the step rule ----------------------------------------------------------------------

def test_only_plans_with_work_or_forget_notices_go_to_the_executor():
    scheduler, fake = _scheduler(), FakeExecutor(16, 32, vocab_size=1024)
    assert scheduler.plan_for_executor() is None   # idle: nothing to send
    scheduler.add_request("r", [1, 2, 3], GREEDY)
    plan = scheduler.plan_for_executor()
    assert plan is not None and awaits_result(plan)
    scheduler.update(plan, fake.execute(plan))
    scheduler.abort_request("r")
    forget = scheduler.plan_for_executor()
    assert forget is not None and forget.dropped_handles and not awaits_result(forget)
    fake.execute(forget)   # the executor forgets the handle; it answers nothing
    assert [o.finish_reason for o in scheduler.take_pending_outputs()] == [FinishReason.ABORT]
    assert scheduler.plan_for_executor() is None


def test_the_in_process_engine_steps_by_the_same_rule():
    from folio.engine import InProcessEngine

    engine = object.__new__(InProcessEngine)   # its scheduler, a fake executor: no model
    engine.scheduler, engine.executor = _scheduler(), FakeExecutor(16, 32, vocab_size=1024)
    engine.ranks = None   # one process: no tensor-parallel ranks
    engine.add_request("a", [4, 5, 6], GREEDY)
    engine.add_request("b", [4, 5], GREEDY)
    tokens: dict[str, list[int]] = {}
    engine.abort_request("b")
    while engine.scheduler.has_work():
        for output in engine.step():
            tokens.setdefault(output.request_id, []).extend(output.new_token_ids)
    expected = _scheduler()
    expected.add_request("a", [4, 5, 6], GREEDY)
    assert tokens == {"b": [], **_run_to_end(expected, FakeExecutor(16, 32, vocab_size=1024))}


# ---- admission: queue limits ------------------------------------------------------------

def test_queue_limits_by_requests_and_by_prompt_tokens():
    scheduler = _scheduler()
    scheduler.add_request("a", [1] * 10, GREEDY)
    scheduler.add_request("b", [1] * 10, GREEDY)
    assert queue_refusal(QueueLimits(), scheduler.waiting, 100) is None   # no limits
    message, code = queue_refusal(QueueLimits(max_requests=2), scheduler.waiting, 1)
    assert code == "queue_full" and "2 requests waiting" in message
    assert queue_refusal(QueueLimits(max_requests=3), scheduler.waiting, 1) is None
    # Two free running seats will take both waiting requests: none of them is queued yet.
    assert queue_refusal(QueueLimits(max_requests=1), scheduler.waiting, 1, free_seats=2) is None
    message, code = queue_refusal(QueueLimits(max_requests=1), scheduler.waiting, 1,
                                  free_seats=1)
    assert code == "queue_full"
    assert queue_refusal(QueueLimits(max_tokens=25), scheduler.waiting, 5) is None
    message, code = queue_refusal(QueueLimits(max_tokens=25), scheduler.waiting, 6)
    assert code == "queue_full" and "20 prompt tokens waiting, limit 25" in message


# ---- the shutdown drain -----------------------------------------------------------------

def test_the_first_signal_drains_until_the_last_request_or_the_timeout_the_second_stops():
    clock = Clock()
    drain = ShutdownDrain(timeout_s=30.0, clock=clock)
    assert not drain.draining and not drain.is_over(0)   # serving: never over
    drain.on_signal(num_running=2)
    assert drain.draining and not drain.stopping
    assert not drain.is_over(2)
    clock.now += 29.9
    assert not drain.is_over(2) and drain.is_over(0)   # the last one ended
    clock.now += 0.1
    assert drain.is_over(2)                            # the timeout: fail the rest
    drain.on_signal(num_running=2)
    assert drain.stopping


# ---- shared stats / page-map answers ----------------------------------------------------

def test_one_answer_per_interval_and_a_new_source_is_seen_at_once():
    clock = Clock()
    cache = CachedReply(0.25, clock=clock)
    builds = itertools.count()
    source = object()
    first = cache.get(source, lambda: b"%d" % next(builds))
    clock.now += 0.25
    assert cache.get(source, lambda: b"%d" % next(builds)) is first
    assert cache.get(None, lambda: b"%d" % next(builds)) == b"1"   # the executor went
    clock.now += 0.26
    assert cache.get(None, lambda: b"%d" % next(builds)) == b"2"


def test_a_new_version_is_seen_at_once():
    # The service passes the finished-request count: a client that got its answer and asks
    # next sees its request counted (its prefix hits), not an answer from before it.
    cache = CachedReply(0.25, clock=Clock())
    builds = itertools.count()
    source = object()
    first = cache.get(source, lambda: b"%d" % next(builds), version=3)
    assert cache.get(source, lambda: b"%d" % next(builds), version=3) is first
    assert cache.get(source, lambda: b"%d" % next(builds), version=4) == b"1"


# ---- steps in flight --------------------------------------------------------------------

@pytest.mark.parametrize("one_ahead", [False, True])
def test_one_step_ahead_only_with_async_scheduling(one_ahead):
    clock = Clock()
    steps = StepsInFlight(one_ahead, clock=clock)
    assert not steps.can_send(has_work=False) and steps.can_send(has_work=True)
    assert steps.step_running_since() is None
    steps.planned(StepPlan(0, running_handles=[1], running_num_tokens=[1]), ahead=False)
    assert steps.step_running_since() == clock.now
    assert steps.can_send(True) is one_ahead
    if one_ahead:
        steps.planned(None, ahead=True)   # the plan ahead found nothing: wait for a result
        assert not steps.can_send(True)
        steps.new_work()                  # until a request arrives
        assert steps.can_send(True)
        steps.planned(StepPlan(1, running_handles=[1], running_num_tokens=[1]), ahead=True)
        assert not steps.can_send(True)   # never two ahead
    clock.now += 1
    assert steps.take(5) is None          # not the step due
    assert steps.take(0).step_id == 0 and steps.step_running_since() == (
        clock.now if one_ahead else None)


def test_after_a_failure_every_step_sent_is_stale_and_a_new_executor_counts_from_zero():
    steps = StepsInFlight(True, clock=Clock())
    steps.planned(StepPlan(3, running_handles=[1], running_num_tokens=[1]), ahead=False)
    steps.planned(StepPlan(4, dropped_handles=[2]), ahead=True)   # forget only: no result
    assert [p.step_id for p in steps.plans] == [3] and steps.ahead_tried
    steps.give_up()
    assert not steps.plans and steps.is_stale(4) and not steps.is_stale(5)
    steps.restart()
    assert not steps.is_stale(0)


# ---- failing requests -------------------------------------------------------------------

def test_failing_requests_ends_each_running_sample_with_the_reason():
    scheduler = _scheduler()
    scheduler.add_request("a", [1, 2], SamplingParams(max_tokens=5, n=2, seed=1))
    scheduler.add_request("b", [1, 2], GREEDY)
    scheduler.add_request("c", [3], GREEDY)
    scheduler.abort_request("c")   # already ended: its abort notice still goes out first
    outputs = fail_requests(scheduler, ["a", "b", "c"], "the executor failed")
    assert [(o.request_id, o.finish_reason, o.error) for o in outputs] == [
        ("c", "abort", None),
        ("a#0", "error", "the executor failed"), ("a#1", "error", "the executor failed"),
        ("b", "error", "the executor failed")]
    assert not scheduler.has_unfinished_requests() and not scheduler.take_pending_outputs()


# ---- the frontend router (inproc) -------------------------------------------------------

@pytest.fixture
def sockets():
    ctx = zmq.Context()
    made: list[zmq.Socket] = []

    def router(address: str, **options: int) -> zmq.Socket:
        sock = ctx.socket(zmq.ROUTER)
        sock.setsockopt(zmq.LINGER, 0)
        sock.setsockopt(zmq.ROUTER_MANDATORY, 1)
        for name, value in options.items():
            sock.setsockopt(getattr(zmq, name), value)
        sock.bind(address)
        made.append(sock)
        return sock

    def dealer(address: str, identity: bytes, server: zmq.Socket) -> zmq.Socket:
        """A peer the server's ROUTER knows (it said something and was read)."""
        sock = ctx.socket(zmq.DEALER)
        sock.setsockopt(zmq.LINGER, 0)
        sock.setsockopt(zmq.IDENTITY, identity)
        sock.connect(address)
        sock.send(b"hi")
        assert server.poll(5000) and server.recv_multipart() == [identity, b"hi"]
        made.append(sock)
        return sock

    yield router, dealer
    for sock in made:
        sock.close(0)
    ctx.term()


def _received(sock: zmq.Socket, timeout: float = 5.0) -> tuple[str, dict]:
    assert sock.poll(int(timeout * 1000)), "nothing arrived"
    return unpack(sock.recv())


def _outputs(sock: zmq.Socket) -> StepOutputs:
    return m.decode_outputs(m.decode(sock.recv(), frozenset({"outputs"}))[1])


@pytest.fixture
def frontends(sockets):
    router_sock, dealer = sockets
    address = f"inproc://fe-{uuid.uuid4().hex}"
    sock = router_sock(address)
    aborted: list[str] = []
    clock = Clock()
    router = FrontendRouter(sock, aborted.append, clock=clock)
    return router, (lambda name: dealer(address, name, sock)), aborted, clock


def test_outputs_go_to_the_frontend_that_owns_them(frontends):
    router, connect, _, _ = frontends
    one, two = connect(b"fe-1"), connect(b"fe-2")
    router.claim("a", b"fe-1", 1)
    router.claim("b", b"fe-2", 2)
    assert router.owns(b"fe-2", "b#1") and not router.owns(b"fe-1", "b#1")
    router.route(StepOutputs(["a", "b#0", "gone"], [7, 8, 9],
                             [EngineOutput("b#1", [3], FinishReason.STOP)]))
    first, second = _outputs(one), _outputs(two)
    assert (first.ids, first.tokens, first.entries) == (["a"], [7], [])
    assert (second.ids, second.tokens) == (["b#0"], [8])
    assert [(o.request_id, o.finish_reason) for o in second.entries] == [("b#1", "stop")]
    assert router.owners == {"a": (b"fe-1", 1), "b": (b"fe-2", 1)}   # one sample left
    router.route([EngineOutput("b#0", [], FinishReason.ABORT)])
    assert [o.request_id for o in _outputs(two).entries] == ["b#0"]
    assert router.request_ids() == ["a"] and router.in_use("a") and not router.in_use("b")
    assert not one.poll(50)


def test_a_silent_frontend_is_given_up_and_told_which_requests_were_aborted(frontends):
    router, connect, aborted, clock = frontends
    silent, other = connect(b"fe-silent"), connect(b"fe-other")
    router.heard_from(b"fe-silent", registers=True)
    router.heard_from(b"fe-other", registers=True)
    router.claim("s-0", b"fe-silent", 1)
    router.claim("o-0", b"fe-other", 1)
    clock.now += FRONTEND_TIMEOUT_S + 1
    router.heard_from(b"fe-other", registers=True)
    router.heartbeat(lambda: b"info")
    kind, body = _received(silent)
    assert kind == "frontend_dropped" and body["ids"] == ["s-0"]
    assert "no heartbeat" in body["reason"]
    assert other.recv() == b"info"
    assert aborted == ["s-0"] and router.request_ids() == ["o-0"]
    assert set(router.frontends) == {b"fe-other"}
    router.heartbeat(lambda: b"again")   # within FRONTEND_HEARTBEAT_S: nothing sent
    assert not other.poll(50)


def test_a_gone_connection_is_parked_then_given_up_once_its_heartbeat_stops(frontends):
    router, connect, aborted, clock = frontends
    router.names[b"gone"] = "fe"   # said hello as "fe", then its connection went
    router.heard_from(b"gone", registers=True)
    router.claim("g-0", b"gone", 1)
    router.send(b"gone", b"info")   # ROUTER_MANDATORY: fails at once
    assert not aborted and b"gone" in router.parked and router.request_ids() == ["g-0"]
    clock.now += PARKED_SILENT_S + 1   # no heartbeat names "fe": its process is gone
    router.heartbeat(lambda: b"info")
    assert aborted == ["g-0"] and router.is_retired(b"gone") and b"gone" not in router.names
    assert "fe" in router.drop_notices and not router.parked
    again = connect(b"fe-again")
    router.on_hello(b"fe-again", "fe", b"info")
    assert again.recv() == b"info"
    kind, body = _received(again)
    assert kind == "frontend_dropped" and body["ids"] == ["g-0"]
    assert "heartbeat stopped" in body["reason"] and not router.drop_notices


def unpack_body(message: tuple[str, dict]):
    from folio.shared.protocol.wire import Body
    return Body("outputs", message[1])


def _parked(router, connect, clock) -> zmq.Socket:
    """Frontend "fe" on connection b"old" with requests r-0 (2 samples) and r-1, one outputs
    message read, then its connection closed with two more sent into it (lost)."""
    old = connect(b"old")
    router.on_hello(b"old", "fe", b"info")
    assert old.recv() == b"info"
    router.heard_from(b"old", registers=True)
    router.claim("r-0", b"old", 2)
    router.claim("r-1", b"old", 1)
    router.route(StepOutputs(["r-0#0", "r-1"], [1, 2]))
    assert _outputs(old).seq == 1
    old.close(0)
    clock.now += 0.1
    router.route(StepOutputs(["r-0#0", "r-1"], [3, 4]))   # into the closing connection
    while b"old" not in router.parked:   # the closed pipe is seen by a send
        router.route(StepOutputs(["r-0#1"], [5]))
    return old


def test_a_parked_frontend_resumes_with_what_it_missed_sent_again(frontends):
    router, connect, aborted, clock = frontends
    _parked(router, connect, clock)
    router.route([EngineOutput("r-1", [6], FinishReason.LENGTH)])   # while it is away
    router.on_heartbeat(b"beats", "fe", b"reply")   # its heartbeat thread still beats
    clock.now += PARKED_SILENT_S
    router.heartbeat(lambda: b"info")
    assert not aborted
    new = connect(b"new")
    router.heard_from(b"new", registers=True)
    router.on_hello(b"new", "fe", b"info", resume_seq=1, resume_ids=["r-0", "r-1", "r-9"])
    replayed = []
    while (message := _received(new))[0] == "outputs":
        replayed.append(m.decode_outputs(unpack_body(message)))
    kind, body = message
    assert kind == "frontend_dropped" and body["ids"] == ["r-9"]   # it never arrived
    assert "retry it" in body["reason"]
    assert new.recv() == b"info"
    assert [o.seq for o in replayed] == list(range(2, 2 + len(replayed)))
    got = [(o.request_id, o.new_token_ids, o.finish_reason) for step in replayed for o in step]
    assert got[0] == ("r-0#0", [3], None) and got[1] == ("r-1", [4], None)
    assert got[-1] == ("r-1", [6], "length") and {g[0] for g in got[2:-1]} == {"r-0#1"}
    assert router.owners == {"r-0": (b"new", 2)} and not router.parked and not aborted
    assert router.is_retired(b"old")


def test_a_resume_drops_what_the_frontend_no_longer_waits_on(frontends):
    router, connect, aborted, clock = frontends
    _parked(router, connect, clock)
    new = connect(b"new")
    router.heard_from(b"new", registers=True)
    router.on_hello(b"new", "fe", b"info", resume_seq=1, resume_ids=["r-1"])
    assert aborted == ["r-0"] and router.owners == {"r-1": (b"new", 1)}
    kinds = []   # what it missed, then engine_info: no notice (nothing it waits on is lost)
    while (raw := new.recv()) != b"info":
        kinds.append(unpack(raw)[0])
    assert kinds and set(kinds) == {"outputs"}, kinds


def test_a_resume_from_before_what_is_kept_fails_its_requests_once(frontends):
    router, connect, aborted, clock = frontends
    _parked(router, connect, clock)
    kept = router.replay.streams["fe"].kept
    while kept[0][0] <= 2:   # message 2 (lost in the link) is no longer kept
        kept.popleft()
    new = connect(b"new")
    router.heard_from(b"new", registers=True)
    router.on_hello(b"new", "fe", b"info", resume_seq=1, resume_ids=["r-0", "r-1", "r-9"])
    kind, body = _received(new)
    assert kind == "frontend_dropped" and sorted(body["ids"]) == ["r-0", "r-1"]
    assert "no longer kept" in body["reason"]
    kind, body = _received(new)
    assert kind == "frontend_dropped" and body["ids"] == ["r-9"]
    assert new.recv() == b"info"
    assert sorted(aborted) == ["r-0", "r-1"] and not router.owners


def test_a_parked_frontend_that_does_not_resume_in_time_is_given_up(frontends):
    router, connect, aborted, clock = frontends
    _parked(router, connect, clock)
    for _ in range(int(2 * RESUME_WINDOW_S / PARKED_SILENT_S) + 2):   # beats, no resume
        clock.now += PARKED_SILENT_S / 2
        router.on_heartbeat(b"beats", "fe", b"reply")
        router.heartbeat(lambda: b"info")
    assert sorted(aborted) == ["r-0", "r-1"] and not router.parked
    assert "did not resume" in str(router.drop_notices["fe"])


def test_a_heartbeat_from_the_frontends_own_thread_keeps_it_registered(frontends):
    router, connect, aborted, clock = frontends
    connect(b"fe-busy")
    beats = connect(b"fe-busy-heartbeat")
    router.on_hello(b"fe-busy", "fe-busy", b"info")
    router.heard_from(b"fe-busy", registers=True)
    router.claim("busy-0", b"fe-busy", 1)
    clock.now += FRONTEND_TIMEOUT_S + 1   # its event loop went quiet
    router.on_heartbeat(b"fe-busy-heartbeat", "fe-busy", b"reply")
    assert beats.recv() == b"reply"
    router.heartbeat(lambda: b"info")
    assert not aborted and router.frontends == {b"fe-busy": clock.now}


def test_a_health_probe_is_answered_but_not_counted_as_a_frontend(frontends):
    router, _, _, clock = frontends
    router.heard_from(b"probe", registers=False)
    assert not router.frontends
    router.heard_from(b"fe", registers=True)
    clock.now += 1
    router.heard_from(b"fe", registers=False)   # ... but it keeps a frontend alive
    assert router.frontends == {b"fe": clock.now}


# ---- the executor link (inproc) ---------------------------------------------------------

@pytest.fixture
def executor(sockets):
    router_sock, dealer = sockets
    address = f"inproc://ex-{uuid.uuid4().hex}"
    sock = router_sock(address, ROUTER_HANDOVER=1)
    clock = Clock()
    link = ExecutorLink(sock, ExecutorTimeouts(heartbeat_s=2.0, step_s=60.0), clock=clock)
    return link, dealer(address, b"ex-1", sock), clock


def test_heartbeats_of_the_attached_executor_keep_it_alive(executor):
    link, _, clock = executor
    link.attach(b"ex-1", 7, CAPACITY)
    clock.now += 1.5
    link.on_heartbeat(7)
    clock.now += 1.5
    assert link.loss(step_running_since=None) is None
    link.on_heartbeat(8)   # another process's: not this executor's sign of life
    clock.now += 0.6
    assert link.loss(None) == "the executor stopped responding (no heartbeat for 2.0 s)"


def test_a_step_past_its_timeout_is_a_hung_executor(executor):
    link, _, clock = executor
    link.attach(b"ex-1", 7, CAPACITY)
    started = clock.now
    clock.now += 60.0
    link.on_heartbeat(7)   # alive, but stuck in one step
    assert link.loss(step_running_since=started) is None
    clock.now += 0.1
    link.on_heartbeat(7)
    assert link.loss(started) == "the executor did not finish a step within 60 s"


def test_a_hello_from_another_peer_does_not_displace_a_live_executor(executor):
    link, _, clock = executor
    assert not link.is_another_live_executor(b"ex-2")   # none attached
    link.attach(b"ex-1", 7, CAPACITY)
    assert link.is_another_live_executor(b"ex-2") and not link.is_another_live_executor(b"ex-1")
    clock.now += 2.0
    assert not link.is_another_live_executor(b"ex-2")   # the attached one went silent


def test_after_a_disconnect_a_probe_finds_out_whether_the_executor_is_still_there(executor):
    link, peer, _ = executor
    link.attach(b"ex-1", 7, CAPACITY)
    link.on_peer_disconnected()   # some peer of the socket left: was it the executor?
    assert link.loss(None) is None and unpack(peer.recv())[0] == "ping"
    peer.close(0)
    deadline = time.monotonic() + 5
    while (reason := link.loss(None)) is None:
        assert time.monotonic() < deadline, "the probe never failed"
        time.sleep(0.01)
    assert reason == "the executor's connection closed"


def test_losing_the_executor_sends_it_a_reset_and_detaches_it(executor):
    link, peer, _ = executor
    link.attach(b"ex-1", 7, CAPACITY)
    assert link.send(b"plan bytes") and peer.recv() == b"plan bytes"
    link.lose()
    assert unpack(peer.recv())[0] == "reset"   # a hung one resets once it is free
    assert link.identity is None and link.pid == -1 and link.capacity == CAPACITY
    link.attach(b"ex-gone", 8, CAPACITY)
    assert not link.send(b"plan bytes")


# ---- the wired service (inproc), with the fake executor ---------------------------------

class Served:
    """A SchedulerService on inproc sockets, one frontend and one fake executor peer, all
    driven from the test's thread: each pump is one turn of the service's loop, then the
    fake executor answers what it was sent."""

    def __init__(self, **settings) -> None:
        tag = uuid.uuid4().hex
        self.service = SchedulerService(SchedulerServiceConfig(
            frontend_address=f"inproc://fe-{tag}", executor_address=f"inproc://ex-{tag}",
            **settings))
        self.frontend = self._peer(self.service.config.frontend_address, None)
        self.executor: zmq.Socket | None = None
        self.fake = FakeExecutor(CAPACITY.block_size, CAPACITY.num_kv_blocks,
                                 vocab_size=CAPACITY.vocab_size)
        self.fail_next_step: str | None = None
        self.tokens: dict[str, list[int]] = {}
        self.finished: dict[str, tuple[str, str | None]] = {}
        self.rejected: dict[str, str] = {}
        self.most_in_flight = 0

    def _peer(self, address: str, identity: bytes | None) -> zmq.Socket:
        sock = self.service.ctx.socket(zmq.DEALER)
        sock.setsockopt(zmq.LINGER, 0)
        if identity is not None:
            sock.setsockopt(zmq.IDENTITY, identity)
        sock.connect(address)
        return sock

    def attach_executor(self, identity: bytes = b"fake-executor", pid: int = 4242) -> None:
        self.executor, self.pid = self._peer(self.service.config.executor_address,
                                             identity), pid
        self.executor.send(m.encode_hello_executor(CAPACITY, pid))
        self.frontend.send(m.pack("frontend_hello", {"id": "fe-test"}))
        self.pump_until(lambda: self.service.scheduler is not None
                        and self.service.router.names)

    def add(self, request_id: str, prompt: list[int], params: SamplingParams = GREEDY) -> None:
        self.frontend.send(m.encode_add(request_id, prompt, params))

    def pump(self) -> None:
        service = self.service
        service._turn()
        self.most_in_flight = max(self.most_in_flight, len(service.steps.plans))
        while self.executor is not None and self.executor.poll(0):
            kind, body = m.decode(self.executor.recv(), frozenset({"plan", "ping", "reset"}))
            if kind != "plan":
                continue
            plan = m.decode_plan(body)
            result = self.fake.execute(plan)   # a failed step still ran (or half ran)
            if plan.is_empty:
                continue   # forget notices only: no answer
            if self.fail_next_step is not None:
                self.executor.send(m.encode_executor_error(plan.step_id, self.fail_next_step))
                self.fail_next_step = None
            else:
                self.executor.send(m.encode_result(result))
        if self.executor is not None:
            self.executor.send(m.encode_heartbeat(self.pid))
        while self.frontend.poll(0):
            kind, body = m.decode(self.frontend.recv(), frozenset(
                {"outputs", "rejected", "engine_info", "frontend_dropped"}))
            if kind == "rejected":
                self.rejected[body.str("id")] = body.str("code")
            elif kind == "outputs":
                outputs = m.decode_outputs(body)
                for request_id, token in zip(outputs.ids, outputs.tokens):
                    self.tokens.setdefault(request_id, []).append(token)
                for output in outputs.entries:
                    self.tokens.setdefault(output.request_id, []).extend(output.new_token_ids)
                    if output.finished:
                        self.finished[output.request_id] = (output.finish_reason, output.error)

    def pump_until(self, until, timeout: float = 10.0) -> None:
        deadline = time.monotonic() + timeout
        while not until():
            assert time.monotonic() < deadline, "timed out"
            self.pump()

    def close(self) -> None:
        self.frontend.close(0)
        if self.executor is not None:
            self.executor.close(0)
        self.service.close()


@pytest.fixture
def served():
    made: list[Served] = []

    def make(**settings) -> Served:
        made.append(Served(**settings))
        return made[-1]

    yield make
    for one in made:
        one.close()


@pytest.mark.parametrize("async_scheduling", [False, True])
def test_requests_run_to_their_end_as_in_the_in_process_engine(served, async_scheduling):
    run = served(async_scheduling=async_scheduling)
    run.attach_executor()
    prompts = {"a": [3, 1, 4, 1, 5], "b": list(range(40)), "c": [2, 7]}
    for request_id, prompt in prompts.items():
        run.add(request_id, prompt)
    run.pump_until(lambda: len(run.finished) == 3)
    assert run.finished == dict.fromkeys(prompts, ("length", None))
    offline = _scheduler()
    for request_id, prompt in prompts.items():
        offline.add_request(request_id, prompt, GREEDY)
    assert run.tokens == _run_to_end(offline, FakeExecutor(16, 32, vocab_size=1024))
    assert run.most_in_flight == (2 if async_scheduling else 1)   # one step ahead
    service = run.service
    assert not service.router.owners and not service.scheduler.has_unfinished_requests()


def test_refusals_name_their_reason(served):
    run = served(max_queued_requests=1, max_num_seqs=1)
    run.frontend.send(m.pack("frontend_hello", {"id": "fe-test"}))
    run.add("early", [1, 2])
    run.pump_until(lambda: "early" in run.rejected)
    assert run.rejected["early"] == "engine_dead"
    run.attach_executor()
    run.frontend.send(m.pack("add", {"id": "bad"}))   # malformed: answered, not fatal
    run.add("huge", [1] * 300)                      # can never fit: the scheduler says so
    run.add("x#1", [1])
    run.pump_until(lambda: {"bad", "huge", "x#1"} <= set(run.rejected))
    assert [run.rejected[i] for i in ("bad", "huge", "x#1")] == ["invalid", "invalid",
                                                                  "rejected"]
    service = run.service
    frontend = next(iter(service.router.names))
    # Handed in between turns, so no step admits q-0 before the next ones arrive: the free
    # seat takes q-0, q-1 waits (the queue's one place), q-2 finds it full.
    for request_id in ("q-0", "q-1", "q-2", "q-0"):   # the last: id in use
        service._on_frontend_message(frontend, m.encode_add(request_id, [1, 2], GREEDY))
    run.pump_until(lambda: {"q-2", "q-0"} <= set(run.rejected))
    assert run.rejected["q-2"] == "queue_full" and run.rejected["q-0"] == "rejected"
    assert "q-1" not in run.rejected


def test_an_executor_error_fails_every_running_request_with_its_message(served):
    run = served()
    run.attach_executor()
    run.fail_next_step = "CUDA error: out of memory"
    run.add("a", [1, 2, 3], SamplingParams(max_tokens=5, n=2, seed=0))
    run.pump_until(lambda: len(run.finished) == 2)
    assert run.finished == dict.fromkeys(
        ("a#0", "a#1"), ("error", "the executor failed a step: CUDA error: out of memory"))
    assert run.service.scheduler is not None   # the executor stays attached: it serves on
    run.add("b", [1, 2, 3])
    run.pump_until(lambda: "b" in run.finished)
    assert run.finished["b"] == ("length", None) and len(run.tokens["b"]) == 5


def test_a_request_aborted_just_before_a_failure_is_released_not_held_in_use(served):
    run = served()
    run.attach_executor()
    run.add("a", list(range(20)), SamplingParams(max_tokens=200, temperature=0))
    run.pump_until(lambda: run.tokens.get("a"))
    run.service.scheduler.abort_request("a")   # its abort notice waits for the next step
    run.service._fail_all("the executor failed a step")
    assert not run.service.router.in_use("a")
    run.pump_until(lambda: "a" in run.finished)
    assert run.finished["a"] == ("abort", None)
    run.add("a", [1, 2, 3])   # the id is free again
    run.pump_until(lambda: run.finished.get("a", ("abort",))[0] == "length")


def test_a_lost_executor_fails_its_requests_and_a_new_one_is_taken_back(served):
    run = served()
    run.attach_executor()
    run.add("a", list(range(20)), SamplingParams(max_tokens=200, temperature=0))
    run.pump_until(lambda: run.tokens.get("a"))
    run.executor.close(0)   # killed (the fake answers no more)
    run.executor = None
    # inproc sockets emit no disconnect events: say what the socket monitor would have
    run.service.executor_link.on_peer_disconnected()
    run.pump_until(lambda: "a" in run.finished)
    reason, error = run.finished["a"]
    # The probe notices (or, in a race with it, the next plan's send): the same news.
    assert reason == "error" and error.startswith("the executor's connection ")
    assert run.service.scheduler is None
    run.add("early", [1, 2])
    run.pump_until(lambda: "early" in run.rejected)
    assert run.rejected["early"] == "engine_dead"
    run.fake = FakeExecutor(16, 32, vocab_size=1024)   # a restarted executor holds nothing
    run.attach_executor(b"fake-executor-2", pid=4343)
    run.add("b", [1, 2, 3])
    run.pump_until(lambda: "b" in run.finished)
    assert run.finished["b"] == ("length", None)


def test_draining_refuses_new_requests_and_stops_after_the_last_one(served):
    run = served()
    run.attach_executor()
    run.add("a", [1, 2, 3], SamplingParams(max_tokens=30, temperature=0))
    run.pump_until(lambda: run.tokens.get("a"))
    run.service._on_signal()   # SIGTERM
    run.add("late", [1, 2])
    run.pump_until(lambda: "late" in run.rejected)
    assert run.rejected["late"] == "shutting_down" and not run.service.shutdown.stopping
    run.pump_until(lambda: run.service.shutdown.stopping)
    assert run.finished == {"a": ("length", None)} and len(run.tokens["a"]) == 30


def test_a_drain_past_its_timeout_fails_what_still_runs(served):
    run = served(shutdown_timeout_s=0.0)
    run.attach_executor()
    run.add("a", [1, 2, 3], SamplingParams(max_tokens=200, temperature=0))
    run.pump_until(lambda: run.tokens.get("a"))
    run.service._on_signal()
    run.pump_until(lambda: run.service.shutdown.stopping)
    run.pump()   # the failure, sent as the loop stops
    assert run.finished == {"a": ("error", "the scheduler is shutting down")}
