"""Slow is not dead: a frontend's liveness rides on a heartbeat thread of its own, and a
scheduler that gives up on a frontend says which requests it aborted (in-process, no model:
the scheduler service is driven by hand, the frontend's engine client has no event loop)."""

from __future__ import annotations

import asyncio
import time

import pytest
import zmq
import zmq.asyncio

from folio.frontend.engine_client import EngineClient
from folio.scheduler.frontend_router import FRONTEND_TIMEOUT_S
from folio.scheduler.service import SchedulerService, SchedulerServiceConfig
from folio.shared.protocol import messages as m
from folio.shared.config import ExecutorCapacity
from folio.shared.sampling_params import SamplingParams
from folio.shared.transport import read_monitor_event
from folio.shared.protocol.wire import unpack

CAPACITY = ExecutorCapacity(num_kv_blocks=32, block_size=16, max_model_len=256,
                            vocab_size=1024, eos_token_ids=(0,))


@pytest.fixture
def service(tmp_path):
    svc = SchedulerService(SchedulerServiceConfig(
        frontend_address=f"ipc://{tmp_path}/fe.sock",
        executor_address=f"ipc://{tmp_path}/ex.sock"))
    svc._on_executor_hello(b"executor-test", CAPACITY, 4242)
    yield svc
    svc.close()


def _dealer(ctx: zmq.Context, address: str, identity: bytes | None) -> zmq.Socket:
    """identity None: the scheduler's ROUTER assigns one (as for a real frontend)."""
    sock = ctx.socket(zmq.DEALER)
    sock.setsockopt(zmq.LINGER, 0)
    if identity is not None:
        sock.setsockopt(zmq.IDENTITY, identity)
    sock.connect(address)
    return sock


def _drain(svc: SchedulerService, until, timeout: float = 5.0) -> None:
    """Run the service's frontend-socket handling until `until()` holds."""
    deadline = time.monotonic() + timeout
    while not until():
        assert time.monotonic() < deadline, "timed out"
        svc._read_burst(svc.frontend_sock, svc._on_frontend_message)
        time.sleep(0.01)


def _messages(sock: zmq.Socket, msg_type: str, timeout: float = 5.0) -> dict:
    deadline = time.monotonic() + timeout
    while sock.poll(max(1, int((deadline - time.monotonic()) * 1000))):
        kind, body = unpack(sock.recv())
        if kind == msg_type:
            return body
    raise AssertionError(f"no {msg_type} within {timeout} s")


def _add(svc: SchedulerService, frontend: bytes, request_id: str) -> None:
    svc._on_frontend_message(frontend, m.encode_add(
        request_id, [5] * 20, SamplingParams(max_tokens=50, temperature=0)))


def _give_up_on_silent_frontends(svc: SchedulerService) -> None:
    svc.router.last_broadcast = 0.0
    svc.router.heartbeat(svc._engine_info)


def test_a_silent_frontend_is_told_which_requests_were_aborted(service):
    ctx = zmq.Context()
    sock = _dealer(ctx, service.config.frontend_address, b"fe-silent")
    other = _dealer(ctx, service.config.frontend_address, b"fe-other")
    try:
        sock.send(m.pack("frontend_hello", {"id": "fe-silent"}))
        other.send(m.pack("frontend_hello", {"id": "fe-other"}))
        _drain(service, lambda: {b"fe-silent", b"fe-other"} <= set(service.router.frontends))
        _add(service, b"fe-silent", "fe-silent-0")
        _add(service, b"fe-silent", "fe-silent-1")
        _add(service, b"fe-other", "fe-other-0")   # another frontend's: untouched
        service.router.frontends[b"fe-silent"] -= FRONTEND_TIMEOUT_S + 1
        _give_up_on_silent_frontends(service)
        body = _messages(sock, "frontend_dropped")
        assert sorted(body["ids"]) == ["fe-silent-0", "fe-silent-1"]
        assert "no heartbeat" in body["reason"]
        assert set(service.router.owners) == {"fe-other-0"}
        assert set(service.scheduler.requests) == {"fe-other-0"}
    finally:
        sock.close(0)
        other.close(0)
        ctx.term()


def test_a_heartbeat_from_the_frontends_own_thread_keeps_it_registered(service):
    ctx = zmq.Context()
    main = _dealer(ctx, service.config.frontend_address, b"fe-busy")
    beats = _dealer(ctx, service.config.frontend_address, b"fe-busy-heartbeat")
    try:
        main.send(m.pack("frontend_hello", {"id": "fe-busy"}))
        _drain(service, lambda: b"fe-busy" in service.router.frontends)
        _add(service, b"fe-busy", "fe-busy-0")
        service.router.frontends[b"fe-busy"] -= FRONTEND_TIMEOUT_S + 1   # its loop went quiet
        beats.send(m.encode_heartbeat(1, "fe-busy"))
        _drain(service, lambda: time.monotonic() - service.router.frontends[b"fe-busy"] < 1)
        _give_up_on_silent_frontends(service)
        assert b"fe-busy" in service.router.frontends and "fe-busy-0" in service.router.owners
        assert b"fe-busy-heartbeat" not in service.router.frontends   # not a frontend itself
        assert unpack(beats.recv())[0] == "heartbeat"           # the scheduler answers
    finally:
        main.close(0)
        beats.close(0)
        ctx.term()


def _turn(svc: SchedulerService) -> None:
    """One turn of the service's loop on the frontend side (no executor involved)."""
    if svc.frontend_monitor.poll(0):
        read_monitor_event(svc.frontend_monitor)
        svc.router.on_peer_disconnected()
    svc._read_burst(svc.frontend_sock, svc._on_frontend_message)
    svc.router.heartbeat(svc._engine_info)


def _run_until(svc: SchedulerService, until, timeout: float = 5.0) -> None:
    deadline = time.monotonic() + timeout
    while not until():
        assert time.monotonic() < deadline, "timed out"
        _turn(svc)
        time.sleep(0.005)


def test_a_notice_that_cannot_be_sent_goes_to_the_frontends_next_connection(service):
    """A frontend's connection goes (it was stopped, its link dropped): the scheduler sees
    it gone within a moment, aborts its requests, and tells the frontend which when it says
    hello again, under the same name, on a new connection."""
    ctx = zmq.Context()
    first = _dealer(ctx, service.config.frontend_address, None)
    try:
        first.send(m.pack("frontend_hello", {"id": "fe-away"}))
        _run_until(service, lambda: len(service.router.names) == 1)
        (old,) = service.router.names
        _add(service, old, "fe-away-0")
        first.close(0)
        start = time.monotonic()
        _run_until(service, lambda: not service.router.owners, timeout=30)
        # The bound is the behaviour: a probe, not the 10 s heartbeat timeout. Half that
        # still tells them apart, with room for a loaded machine.
        assert time.monotonic() - start < 5.0
        assert not service.scheduler.requests and old in service.router.retired
        again = _dealer(ctx, service.config.frontend_address, None)
        again.send(m.pack("frontend_hello", {"id": "fe-away"}))
        _run_until(service, lambda: any(i != old for i in service.router.names))
        assert _messages(again, "frontend_dropped")["ids"] == ["fe-away-0"]
        assert not service.router.drop_notices
        again.close(0)
    finally:
        first.close(0)
        ctx.term()


def test_no_peer_takes_over_a_frontends_connection_or_a_gone_ones_id(service):
    """Routing ids are the scheduler's: a peer naming a live frontend's id is refused (no
    handover), and one naming the id of a connection already given up on is ignored, so
    neither sees that frontend's outputs nor aborts its requests."""
    ctx = zmq.Context()
    real = _dealer(ctx, service.config.frontend_address, None)
    thief = None
    try:
        real.send(m.pack("frontend_hello", {"id": "fe-real"}))
        _run_until(service, lambda: len(service.router.names) == 1)
        (rid,) = service.router.names
        assert rid[0] == 0   # assigned by the ROUTER, not chosen by the frontend
        _add(service, rid, "fe-real-0")
        thief = _dealer(ctx, service.config.frontend_address, rid)
        thief.send(m.encode_abort("fe-real-0"))
        thief.send(m.pack("frontend_hello", {"id": "fe-thief"}))
        for _ in range(20):
            _turn(service)
            time.sleep(0.01)
        assert "fe-real-0" in service.router.owners and service.router.names == {rid: "fe-real"}
        assert not thief.poll(100)   # nothing for the thief
        real.close(0)   # the real one goes; its id is retired, not free for the taking
        _run_until(service, lambda: rid in service.router.retired)
        thief.close(0)
        thief = _dealer(ctx, service.config.frontend_address, rid)
        thief.send(m.pack("frontend_hello", {"id": "fe-real"}))
        for _ in range(20):
            _turn(service)
            time.sleep(0.01)
        assert rid not in service.router.frontends and not thief.poll(100)
    finally:
        real.close(0)
        if thief is not None:
            thief.close(0)
        ctx.term()


class _Sink:
    def __init__(self) -> None:
        self.errors: list[tuple[str, str]] = []

    def delta(self, *args) -> None:
        pass

    def final(self, result) -> None:
        pass

    def error(self, code: str, message: str) -> None:
        self.errors.append((code, message))


def test_the_frontend_fails_exactly_the_dropped_requests(tmp_path, tokenizer_dir):
    from folio.shared.hf_tokenizer import load_tokenizer

    async def run():
        ctx = zmq.asyncio.Context()
        engine = EngineClient(load_tokenizer(tokenizer_dir), f"ipc://{tmp_path}/none.sock",
                              ctx)
        try:
            sinks = [_Sink(), _Sink()]
            ids = [engine.submit([5, 6], SamplingParams(), sink) for sink in sinks]
            engine._on_dropped([ids[0], "unknown-id"], "no heartbeat from it for 10 s")
            return ids, sinks, set(engine.requests)
        finally:
            engine.close()
            ctx.term()

    ids, sinks, left = asyncio.run(run())
    assert [code for code, _ in sinks[0].errors] == ["engine_dead"]
    assert "gave up on this frontend" in sinks[0].errors[0][1]
    assert not sinks[1].errors and left == {ids[1]}


def test_the_heartbeat_thread_hears_the_scheduler_without_an_event_loop(service,
                                                                        tokenizer_dir):
    from folio.shared.hf_tokenizer import load_tokenizer

    ctx = zmq.asyncio.Context()
    engine = EngineClient(load_tokenizer(tokenizer_dir), service.config.frontend_address, ctx)
    try:
        assert not engine.scheduler_alive
        engine.heartbeat.start()   # nothing reads the engine's own socket: no loop runs
        _drain(service, lambda: engine.heartbeat.seen > 0)
        assert engine.scheduler_alive
        engine.link_down_at = time.monotonic()   # a disconnect after the last answer
        assert not engine.scheduler_alive
    finally:
        engine.close()
        ctx.term()


def test_a_pool_smaller_than_the_context_is_said_not_silent(service, caplog):
    """`--num-kv-blocks 1` serves (requests that fit are run), but not silently."""
    import logging

    small = ExecutorCapacity(num_kv_blocks=1, block_size=16, max_model_len=256,
                             vocab_size=1024, eos_token_ids=(0,))
    with caplog.at_level(logging.WARNING, logger="folio.scheduler"):
        service._on_executor_hello(b"executor-test", small, 4242)
    assert "holds 16 tokens, fewer than max_model_len 256" in caplog.text
