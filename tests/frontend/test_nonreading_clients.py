"""Issue 25 (part 3, item 2), at the ZeroMQ gateway: a client that sends and never reads, or
leaves with messages still queued, costs only itself.

The real gateway on a real ipc:// socket, in this process, in front of a fake engine that
records what reaches it; the gateway's send queue is made small so a non-reading client
fills it in a few thousand messages. And: the gateway's socket survives a flood-and-leave
(libzmq aborts the process there when the socket sends ZMTP heartbeats)."""

from __future__ import annotations

import asyncio
import gc
import logging
import subprocess
import sys
import uuid

import pytest
import zmq
import zmq.asyncio

from folio.frontend.engine_client import FinalResult, SampleResult
from folio.frontend.input_processor import InputProcessor, ModelFacts
from folio.frontend.prep import Preparer
from folio.frontend.zmq_gateway import ClientLimits, ZmqGateway
from folio.shared.protocol import messages as m
from folio.shared.protocol.codes import FinishReason, RefusalCode
from folio.shared.sampling_params import SamplingParams
from folio.shared.protocol.wire import unpack
from tests.pipeline import ROOT
from tests.soak.nonreading_client import non_reading_dealer

CAP = 8
STREAM = SamplingParams(max_tokens=64, ignore_eos=True)


class FakeEngine:
    """What the gateway asks of the engine client; it records submits and aborts, and an
    abort ends its request with an `abort` final, as the scheduler's answer would."""

    def __init__(self) -> None:
        self.prep = Preparer()
        self.tokenizer = None
        self.inputs = InputProcessor(None)   # token-id prompts only
        self.facts = ModelFacts(vocab_size=1024, max_model_len=256, max_logprobs=20, max_n=64)
        self.draining, self.engine_alive = False, True
        self.pooling = None   # the generate runner
        self.sinks: dict[str, object] = {}
        self.submitted: list[str] = []
        self.aborted: list[str] = []

    def submit(self, ids, params, sink, deadline=None, stops=None, client=None) -> str:
        request_id = f"r{len(self.submitted)}"
        self.submitted.append(request_id)
        self.sinks[request_id] = sink
        return request_id

    def abort(self, request_id: str) -> None:
        self.aborted.append(request_id)
        sink = self.sinks.pop(request_id, None)
        if sink is not None:
            asyncio.get_running_loop().call_soon(sink.final, FinalResult(
                [SampleResult(0, "", [], FinishReason.ABORT, None, None)], 3, None))

    def step(self) -> None:
        """One token for every running request."""
        for sink in list(self.sinks.values()):
            sink.delta(0, "x", [7], None)


def _generate(client_id: str | None = None) -> bytes:
    return m.encode_generate(client_id or uuid.uuid4().hex, STREAM, True,
                             prompt_token_ids=[5, 6, 7])


async def _until(condition, what: str, timeout: float = 30.0) -> None:
    deadline = asyncio.get_running_loop().time() + timeout
    while not condition():
        assert asyncio.get_running_loop().time() < deadline, f"never: {what}"
        await asyncio.sleep(0.01)


async def _with_gateway(tmp_path, body) -> None:
    """Run `body(gateway, engine, address)` against a served gateway with a small queue;
    every exception the loop saw but nobody retrieved fails the test."""
    unretrieved: list[dict] = []
    loop = asyncio.get_running_loop()
    loop.set_exception_handler(lambda _, context: unretrieved.append(context))
    ctx = zmq.asyncio.Context()
    engine = FakeEngine()
    address = f"ipc://{tmp_path}/gw.sock"
    # A client is cut off after a few hundred queued replies, not 100 000.
    gateway = ZmqGateway(engine, address, ctx,
                         limits=ClientLimits(max_requests=CAP, send_queue=200, send_buffer=4096))
    serving = asyncio.create_task(gateway.serve())
    try:
        await body(gateway, engine, address)
    finally:
        serving.cancel()
        await asyncio.gather(serving, return_exceptions=True)
        gateway.close()
        engine.prep.close()
        ctx.term()
    gc.collect()   # a dropped future with an exception reports it when collected
    await asyncio.sleep(0)
    assert unretrieved == []


def test_a_client_that_never_reads_is_cut_off_once_and_told_when_it_reads_again(
        tmp_path, caplog):
    caplog.set_level(logging.INFO, "folio.frontend")

    async def body(gateway, engine, address):
        sync_ctx = zmq.Context()
        attacker = non_reading_dealer(sync_ctx, address)
        try:
            ids = [uuid.uuid4().hex for _ in range(CAP)]
            for client_id in ids:
                attacker.send(_generate(client_id))
            for _ in range(50):   # past the cap: refused, each answer queued
                attacker.send(_generate())
            await _until(lambda: len(engine.submitted) == CAP,
                         "the attacker's requests were accepted")
            for _ in range(5000):   # tokens until its queue is full (bounded)
                if gateway.cut_off:
                    break
                engine.step()
                await asyncio.sleep(0)
            assert len(gateway.cut_off) == 1, "its queue never filled"
            assert sorted(engine.aborted) == sorted(engine.submitted)   # each once
            assert not gateway.by_client
            for _ in range(200):   # more tokens and more requests: dropped, none started
                engine.step()
                attacker.send(_generate())
                await asyncio.sleep(0)
            await asyncio.sleep(0.2)
            assert len(engine.submitted) == CAP
            assert sorted(engine.aborted) == sorted(engine.submitted)

            # It reads again: it hears of each aborted request, then is served again.
            told: set[str] = set()
            deadline = asyncio.get_running_loop().time() + 30
            while not told >= set(ids):
                assert asyncio.get_running_loop().time() < deadline, told
                if attacker.poll(10):
                    kind, reply = unpack(attacker.recv())
                    if kind == "error" and reply["code"] == RefusalCode.SLOW_READER:
                        told.add(reply["id"])
                await asyncio.sleep(0)
            await _until(lambda: not gateway.cut_off, "the client was served again")
            attacker.send(_generate())
            await _until(lambda: len(engine.submitted) == CAP + 1, "a new request started")
        finally:
            attacker.close(0)
            sync_ctx.term()

    asyncio.run(_with_gateway(tmp_path, body))
    about = [r for r in caplog.records if "client" in r.getMessage()]
    assert [r.getMessage().split(" ")[2:5] for r in about] == [
        ["does", "not", "read"], ["reads", "its", "replies"]], about


def test_messages_a_client_left_behind_start_nothing(tmp_path, caplog):
    caplog.set_level(logging.INFO, "folio.frontend")

    async def body(gateway, engine, address):
        sync_ctx = zmq.Context()
        leaver = sync_ctx.socket(zmq.DEALER)
        leaver.connect(address)
        # Sent while the gateway cannot read (no await), then the client is gone.
        for _ in range(400):
            leaver.send(_generate())
        leaver.close(linger=5000)
        sync_ctx.term()   # returns once everything queued has left
        for _ in range(300):   # the gateway reads the backlog meanwhile
            engine.step()
            await asyncio.sleep(0.005)
        await _until(lambda: not gateway.by_client, "its requests were given up")
        assert len(engine.submitted) <= CAP   # never more than its cap, at once or after
        assert sorted(engine.aborted) == sorted(engine.submitted)
        assert len(gateway.gone) == 1 and not gateway.cut_off

    asyncio.run(_with_gateway(tmp_path, body))
    about = [r.getMessage() for r in caplog.records if "client" in r.getMessage()]
    assert len(about) == 1 and "left: aborted its" in about[0], about


FLOOD_AND_LEAVE = """
import sys, time, zmq, zmq.asyncio
from folio.frontend.zmq_gateway import client_socket
ctx = zmq.asyncio.Context()
router = client_socket(ctx)
router.setsockopt(zmq.RCVHWM, 10)   # its input stops at once: the state libzmq trips on
router.bind(sys.argv[1])
peer_ctx = zmq.Context()
for _ in range(3):
    peer = peer_ctx.socket(zmq.DEALER)
    peer.setsockopt(zmq.HEARTBEAT_IVL, 5)   # pings in what it sends
    peer.connect(sys.argv[1])
    start = time.monotonic()
    while time.monotonic() - start < 0.5:   # flood; nobody reads the router meanwhile
        try:
            peer.send(b"x" * 100, zmq.NOBLOCK)
        except zmq.Again:
            time.sleep(0.001)
    peer.close(0)   # and leave while its queue is full
    time.sleep(1.0)   # three heartbeat intervals of the default configure()
print("survived")
"""


def test_the_client_socket_survives_a_flood_and_leave(tmp_path):
    done = subprocess.run([sys.executable, "-c", FLOOD_AND_LEAVE, f"ipc://{tmp_path}/f.sock"],
                          cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0 and "survived" in done.stdout, done.stderr[-2000:]


def test_what_the_gateway_remembers_of_clients_is_bounded():
    from folio.frontend.client_cutoff import CutOffClients, GoneClients

    now = [0.0]
    cut = CutOffClients(limit=3, min_s=1.0, clock=lambda: now[0])
    for i in range(10):
        cut.add(bytes([i]), [f"r{i}"], room=2)
    assert cut.clients() == [bytes([7]), bytes([8]), bytes([9])]   # the oldest forgotten
    for n in range(5):   # told of at most `room` dropped requests
        cut.dropped(bytes([9]), f"late{n}")
    assert cut.notices(bytes([9])) == ["r9", "late0", "late1"]
    assert not cut.may_try(bytes([9]))
    now[0] = 1.0
    assert cut.may_try(bytes([9]))

    gone = GoneClients(limit=2, quiet_s=1.0, clock=lambda: now[0])
    for i in range(3):
        gone.add(bytes([i]))
    assert len(gone) == 2 and not gone.drops(bytes([0]))
    now[0] = 1.5
    assert gone.drops(bytes([2]))          # its backlog, read without pause
    now[0] = 2.4
    assert gone.drops(bytes([2]))
    now[0] = 3.5
    assert not gone.drops(bytes([2]))      # quiet for over 1 s: its id may be reused
    assert len(gone) == 1
