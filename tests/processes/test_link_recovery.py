"""Links that drop come back by themselves (issue 20): a message over MAXMSGSIZE makes
libzmq end the receiving side's session for good (no reconnect after a protocol error), so
each connecting side connects afresh; and the SDK names the real cause of a refused
connection.

Real sockets: the executor service and an engine client, each in this process and linked to
a ROUTER that this test binds in the scheduler's place and drives by hand.
"""

from __future__ import annotations

import asyncio
import logging
import os
import signal
import socket
import threading
import time

import zmq
import zmq.asyncio

from folio.client import AsyncClient
from folio.errors import ServerUnreachable
from folio.shared.outputs import EngineOutput, FinishReason, StepOutputs
from folio.shared.protocol import messages as m
from folio.shared.sampling_params import SamplingParams
from folio.shared.protocol.wire import MAX_MESSAGE_BYTES, unpack


def _oversize() -> bytes:
    """One byte over the limit every Folio socket sets (made when used: it is 64 MiB)."""
    return b"x" * (MAX_MESSAGE_BYTES + 1)


def _router(ctx: zmq.Context, address: str) -> zmq.Socket:
    sock = ctx.socket(zmq.ROUTER)
    sock.setsockopt(zmq.LINGER, 0)
    sock.setsockopt(zmq.ROUTER_MANDATORY, 1)
    sock.setsockopt(zmq.MAXMSGSIZE, MAX_MESSAGE_BYTES)
    sock.bind(address)
    return sock


def _wait_for(sock: zmq.Socket, msg_type: str, timeout: float) -> tuple[bytes, dict]:
    """The next [identity, message] of this type (others are skipped); a frontend's
    heartbeats are answered meanwhile, as the scheduler does."""
    deadline = time.monotonic() + timeout
    while (left := deadline - time.monotonic()) > 0:
        if sock.poll(int(left * 1000) + 1):
            identity, data = sock.recv_multipart()
            kind, body = unpack(data)
            if kind == "heartbeat" and "frontend" in body:
                sock.send_multipart([identity, m.encode_heartbeat(0)])
            if kind == msg_type:
                return identity, body
    raise AssertionError(f"no {msg_type} within {timeout} s")


async def _until_alive(router: zmq.Socket, engine) -> None:
    """Answer heartbeats until the engine client holds the scheduler alive."""
    deadline = time.monotonic() + 10
    while not engine.scheduler_alive:
        assert time.monotonic() < deadline, "the engine never heard the scheduler"
        await asyncio.to_thread(_wait_for, router, "heartbeat", 2)


def test_an_executor_sent_an_oversize_message_says_hello_again(tmp_path, llama_dir,
                                                                caplog):
    """The real executor service (in this process, on the main thread as in its own),
    linked to a ROUTER that stands in for the scheduler: after a message over the limit
    cuts its link, it connects afresh and says hello again, and the new link carries."""
    from folio.executor.service import ExecutorService, ExecutorServiceConfig
    from folio.shared.config import EngineConfig

    ctx = zmq.Context()
    address = f"ipc://{tmp_path}/ex.sock"
    router = _router(ctx, address)
    service = ExecutorService(ExecutorServiceConfig(address, EngineConfig(
        model=str(llama_dir), dtype="float32", device="cpu", num_kv_blocks=16)))
    seen: dict = {}

    def scheduler() -> None:
        try:
            identity, seen["first"] = _wait_for(router, "executor_hello", timeout=30)
            router.send_multipart([identity, _oversize()])   # the executor's side drops the link
            identity, seen["again"] = _wait_for(router, "executor_hello", timeout=10)
            router.send_multipart([identity, m.pack("reset", {})])   # the new link carries
            seen["after_reset"] = _wait_for(router, "executor_hello", timeout=5)[1]
        finally:
            service.stop.set()

    handlers = {sig: signal.getsignal(sig) for sig in (signal.SIGTERM, signal.SIGINT)}
    driver = threading.Thread(target=scheduler, daemon=True)
    driver.start()
    try:
        with caplog.at_level(logging.WARNING, logger="folio.executor"):
            service.run()
    finally:
        for sig, handler in handlers.items():
            signal.signal(sig, handler)
        driver.join(timeout=5)
        router.close(0)
        ctx.term()
    assert seen["again"]["pid"] == seen["first"]["pid"] == os.getpid(), seen.keys()
    assert "after_reset" in seen
    assert "connecting afresh" in caplog.text


class _Sink:
    def __init__(self) -> None:
        self.events: list[tuple] = []

    def delta(self, index, text, token_ids, logprobs) -> None:
        self.events.append(("delta", list(token_ids)))

    def final(self, result) -> None:
        self.events.append(("final", result.samples[0].token_ids,
                            result.samples[0].finish_reason))

    def error(self, code: str, message: str) -> None:
        self.events.append(("error", code, message))


def _outputs(seq: int, request_id: str, token: int, finish=None) -> bytes:
    if finish is None:
        return m.encode_outputs(StepOutputs([request_id], [token]), seq)
    return m.encode_outputs(StepOutputs(entries=[EngineOutput(request_id, [token], finish)]),
                            seq)


def _cut_link(tmp_path, tokenizer_dir, answer_resume):
    """An engine client linked to a ROUTER standing in for the scheduler: a request is
    added and one outputs message (number 1) read, then an oversize message cuts the link.
    `answer_resume(router, identity, hello, request_id)` answers the hello that comes back.
    Returns (the request's sink events, the two hellos, a later request's add)."""
    from folio.frontend.engine_client import EngineClient
    from folio.shared.hf_tokenizer import load_tokenizer

    address = f"ipc://{tmp_path}/fe.sock"
    plain = zmq.Context()
    router = _router(plain, address)

    async def run():
        ctx = zmq.asyncio.Context()
        engine = EngineClient(load_tokenizer(tokenizer_dir), address, ctx)
        tasks = [asyncio.create_task(t) for t in engine.tasks()]
        try:
            identity, first = await asyncio.to_thread(_wait_for, router, "frontend_hello", 10)
            router.send_multipart([identity, _info("run-1")])
            await _until_alive(router, engine)
            sink = _Sink()
            request_id = engine.submit([5, 6], SamplingParams(max_tokens=3), sink)
            await asyncio.to_thread(_wait_for, router, "add", 5)
            router.send_multipart([identity, _outputs(1, request_id, 11)])
            while not sink.events:   # read: the frontend has message 1
                await asyncio.sleep(0.01)
            router.send_multipart([identity, _oversize()])
            new_identity, hello = await asyncio.to_thread(_wait_for, router, "frontend_hello",
                                                          10)
            assert new_identity != identity   # a new connection is a new peer
            answer_resume(router, new_identity, hello, request_id)
            await _until_alive(router, engine)
            while not any(e[0] in ("final", "error") for e in sink.events):
                await asyncio.sleep(0.01)
            later = _Sink()
            later_id = engine.submit([7, 8], SamplingParams(max_tokens=4), later)
            _, add = await asyncio.to_thread(_wait_for, router, "add", 5)
            assert add["id"] == later_id and later.events == []
            return sink.events, first, hello, request_id
        finally:
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
            engine.close()
            ctx.term()

    try:
        return asyncio.run(run())
    finally:
        router.close(0)
        plain.term()


def _info(epoch: str) -> bytes:
    return m.EngineInfo(max_model_len=64, vocab_size=1000, num_kv_blocks=8, block_size=16,
                        epoch=epoch).encode()


def test_a_frontend_link_cut_by_an_oversize_message_resumes_its_request_exactly(
        tmp_path, tokenizer_dir):
    """The link comes back by itself; the hello names the last message read and the request
    still waited on; what the scheduler sends again is read once (message 1, sent again, is
    skipped) and the request ends as if nothing had happened."""
    def resume(router, identity, hello, request_id):
        assert hello["seq"] == 1 and hello["ids"] == [request_id]
        for message in (_outputs(1, request_id, 11), _outputs(2, request_id, 12),
                        _outputs(3, request_id, 13, FinishReason.LENGTH), _info("run-1")):
            router.send_multipart([identity, message])

    events, first, _, _ = _cut_link(tmp_path, tokenizer_dir, resume)
    assert "seq" not in first   # a first hello resumes nothing
    assert events == [("delta", [11]), ("delta", [12]), ("delta", [13]),
                      ("final", [11, 12, 13], "length")], events


def test_a_request_the_scheduler_cannot_resume_fails_once_with_its_reason(
        tmp_path, tokenizer_dir):
    """A scheduler that restarted (or no longer keeps what was missed) names the request:
    it fails once, with that reason, and the link carries new requests."""
    def refuse(router, identity, hello, request_id):
        for notice in m.encode_frontend_dropped([request_id], "the scheduler restarted"):
            router.send_multipart([identity, notice])
        router.send_multipart([identity, _info("run-2")])

    events, _, _, _ = _cut_link(tmp_path, tokenizer_dir, refuse)
    assert events[0] == ("delta", [11]) and len(events) == 2, events
    assert events[1][:2] == ("error", "engine_dead") and "restarted" in events[1][2]


def test_the_sdk_does_not_blame_curve_keys_for_a_server_that_closes_connections():
    """A server out of descriptors (or overloaded) accepts and closes at once: the SDK says
    so, and does not tell the user to bring CURVE keys."""
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(64)
    stop = threading.Event()

    def accept_and_close() -> None:
        listener.settimeout(0.1)
        while not stop.is_set():
            try:
                conn, _ = listener.accept()
            except OSError:
                continue
            conn.close()

    thread = threading.Thread(target=accept_and_close, daemon=True)
    thread.start()

    async def run() -> str:
        client = AsyncClient(f"tcp://127.0.0.1:{listener.getsockname()[1]}",
                             connect_timeout=1.5)
        try:
            await client.health(timeout=1)
        except ServerUnreachable as error:
            return str(error)
        finally:
            await client.close()
        return "no error"

    try:
        message = asyncio.run(run())
    finally:
        stop.set()
        thread.join(timeout=2)
        listener.close()
    assert "CURVE" not in message and "closed the connection" in message, message
