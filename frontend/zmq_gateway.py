"""The ZeroMQ gateway: the SDK's client socket (ROUTER) in front of the engine client.

Small messages are handled on the event loop as they come. A large one (a long prompt or
chat) is decoded and tokenized in the engine client's preparation pool (frontend/prep.py);
an `abort` that arrives meanwhile for it is remembered and applied when it is ready.

A client costs only itself: it may have `max_requests` requests in flight (more are refused
as queue_full), and its replies queue up to the socket's SNDHWM. A client whose queue is full
does not read: its requests are aborted once, its further output and messages are dropped,
and it gets a `slow_reader` error for each aborted request when it reads again
(client_cutoff.py). A client that left has its requests aborted once, and what it sent
before leaving that is still queued here is dropped unread.
"""

from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass
from typing import Any

import zmq
import zmq.asyncio

from folio.frontend.openai.pooling.sdk_requests import (pooled_answer, prepare_pooled,
                                                        runner_problem)
from folio.frontend.client_peers import ClientPeers
from folio.frontend.http.access import priority_problem
from folio.frontend.client_cutoff import CutOffClients, GoneClients
from folio.frontend.engine_api import Engine, FinalResult
from folio.frontend.input_processor import InputError, ProcessedPrompt
from folio.shared.protocol import messages as m
from folio.shared.protocol.codes import FinishReason, RefusalCode
from folio.shared.config import MAX_REQUESTS_PER_CLIENT
from folio.shared.security import CurveKeys, make_server
from folio.shared.transport import check_bind_address, configure, send_now
from folio.shared.protocol.wire import MAX_ID_LEN, MAX_MESSAGE_BYTES, Body, ProtocolError, unpack

log = logging.getLogger("folio.frontend")
MAX_EARLY_ABORTS = 1024   # aborts kept for requests still being prepared
CUT_OFF_RETRY_S = 0.5     # how often cut-off clients are tried again


@dataclass(frozen=True)
class ClientLimits:
    """What one client may hold of the gateway (requests: over all its connections; the
    queues: per connection), and the most urgent priority it may ask."""

    max_requests: int = MAX_REQUESTS_PER_CLIENT   # in flight; more are refused (queue_full)
    priority_floor: int | None = None   # --priority-floor (SDK clients have no priority key)
    # Replies queued for it (SNDHWM); full: it does not read. 128 per stream at 256 streams,
    # the HTTP API's slow_reader bound; about 3 s of a 10 000/s flood's refusals past its cap.
    send_queue: int = 32_768
    send_buffer: int | None = None   # the kernel's send buffer (SNDBUF); None: the OS's


class _ClientSink:
    def __init__(self, gateway: "ZmqGateway", client: bytes, client_id: str,
                 stream: bool, pooled=None) -> None:
        self.gateway, self.client, self.client_id, self.stream = (gateway, client, client_id,
                                                                  stream)
        self.pooled = pooled   # a pooling request's answer from the engine's vector

    def delta(self, index: int, text: str, token_ids: list[int],
              logprobs: list[dict[str, Any]] | None) -> None:
        if self.stream:
            self.gateway.reply(self.client, m.encode_delta(self.client_id, text, token_ids,
                                                           logprobs, index))

    def final(self, result: FinalResult) -> None:
        self.gateway.forget(self.client, self.client_id)
        sample = result.samples[0]
        samples = None if len(result.samples) == 1 else [
            {"index": s.index, "text": s.text, "token_ids": s.token_ids,
             "finish_reason": s.finish_reason, "stop_reason": s.stop_reason,
             **({} if s.logprobs is None else {"logprobs": s.logprobs})}
            for s in result.samples]
        payload = m.encode_final(
            self.client_id, sample.text, sample.token_ids, sample.finish_reason,
            result.prompt_tokens, sample.logprobs, sample.stop_reason, result.prompt_logprobs,
            None if self.pooled is None or sample.pooled is None else self.pooled(sample.pooled),
            samples)
        if len(payload) > MAX_MESSAGE_BYTES:   # the client's socket would drop the connection
            payload = m.encode_error(self.client_id, RefusalCode.INVALID, (
                f"the result ({len(payload)} bytes) exceeds the {MAX_MESSAGE_BYTES}-byte "
                "message limit; ask for fewer tokens or logprobs"))
        self.gateway.reply(self.client, payload, self.client_id)

    def error(self, code: str, message: str) -> None:
        self.gateway.forget(self.client, self.client_id)
        self.gateway.reply(self.client, m.encode_error(self.client_id, code, message),
                           self.client_id)


class ZmqGateway:
    def __init__(self, engine: Engine, address: str, ctx: zmq.asyncio.Context,
                 keys: CurveKeys | None = None, limits: ClientLimits = ClientLimits()
                 ) -> None:
        self.engine = engine
        self.address = address
        self.max_requests = limits.max_requests
        self.priority_floor = limits.priority_floor
        self.sock = make_server(client_socket(ctx, limits), keys)
        self.sock.bind(check_bind_address(address))
        self.by_client: dict[bytes, dict[str, str]] = {}   # client -> its id -> engine id
        self.peers = ClientPeers()   # connection -> client, and each client's load
        self.cut_off = CutOffClients()
        self.gone = GoneClients()
        self.preparing: dict[bytes, int] = {}          # client -> requests in the pool or admission
        self.early_aborts: set[tuple[bytes, str]] = set()

    def close(self) -> None:
        self.sock.close(0)

    async def serve(self) -> None:
        retry = asyncio.create_task(self._retry_cut_off())
        try:
            await self._read()
        finally:
            retry.cancel()

    async def _read(self) -> None:
        received = 0
        prep = self.engine.prep
        while True:
            frames = await self.sock.recv_multipart(copy=False)
            received += 1
            if received % 64 == 0:
                # A ready socket never suspends the await above: let the other tasks
                # (scheduler link, HTTP) run during a burst.
                await asyncio.sleep(0)
            if len(frames) != 2:
                continue
            client, data = frames[0].bytes, frames[1].bytes
            self.peers.note(client, frames[1])
            if self.gone.drops(client):
                continue   # sent before it left: nobody would read the answer
            if client in self.cut_off and not self._served_again(client, data):
                continue   # it still does not read: its message is dropped
            if prep.small(len(data)):
                self._on_message(client, data)
                continue
            await prep.reserve()   # the pool is full: leave the rest queued in the socket
            self.preparing[client] = self.preparing.get(client, 0) + 1
            asyncio.create_task(self._on_large(client, prep.submit(self._decode_large, data)))

    def _on_message(self, client: bytes, data: bytes) -> None:
        if self.peers.load(client) >= self.max_requests and \
                self._refused_at_cap(client, data):
            return
        try:
            msg_type, body = m.decode(data, m.CLIENT_TO_GATEWAY)
            self._dispatch(client, msg_type, body)
        except ProtocolError as error:
            self._bad_message(client, m.peek_id(data), error)

    def _dispatch(self, client: bytes, msg_type: str, body) -> None:
        if msg_type == "generate":
            request = m.GenerateRequest.decode(body)
            if not self._refused(client, request):
                try:
                    prepared = self._prepare(request)
                except ValueError as error:
                    self.reply(client, m.encode_error(request.id, RefusalCode.INVALID,
                                                      str(error)), request.id)
                    return
                self._start(client, request, prepared)
        elif msg_type == "abort":
            client_id = m.decode_client_query(body).request_id
            request_id = self.by_client.get(client, {}).get(client_id)
            if request_id is not None:
                self.engine.abort(request_id)
            elif self.preparing.get(client) and len(self.early_aborts) < MAX_EARLY_ABORTS:
                self.early_aborts.add((client, client_id))
        elif msg_type == "health":
            asyncio.create_task(self._on_health(client, m.decode_client_query(body).request_id))
        elif msg_type == "kv_map":
            asyncio.create_task(self._on_kv_map(client, m.decode_client_query(body).request_id))

    def _refused_at_cap(self, client: bytes, data: bytes) -> bool:
        """A generate from a client at its cap, refused before its parameters are decoded
        (a tenth of the cost: a client that floods pays little of the loop's time)."""
        client_id = _answered_id(data, ("generate",))
        if client_id is None:
            return False   # not a generate, or malformed (answered as such)
        self.reply(client, m.encode_error(client_id, *self._at_cap(client)), client_id)
        return True

    def _at_cap(self, client: bytes) -> tuple[RefusalCode, str]:
        return RefusalCode.QUEUE_FULL, (
            f"this client ({self.peers.client(client)}) has {self.peers.load(client)} "
            "requests in flight over its connections, the most one client may have "
            "(--max-requests-per-client); wait for some to end")

    def _bad_message(self, client: bytes, client_id: str, error: ProtocolError) -> None:
        log.warning("bad client message: %s", error)
        self.reply(client, m.encode_error(client_id, RefusalCode.INVALID, str(error)),
                   client_id)

    def _decode_large(self, data: bytes):
        """In the pool: decode a large message and, for a generate, prepare its prompt."""
        try:
            msg_type, raw = unpack(data)
        except ProtocolError as error:
            return "malformed", "", error   # no readable id
        client_id = raw.get("id")
        if not (isinstance(client_id, str) and 0 < len(client_id) <= MAX_ID_LEN):
            client_id = ""
        try:
            if msg_type not in m.CLIENT_TO_GATEWAY:
                raise ProtocolError(f"unexpected message type {msg_type!r} on this socket")
            if msg_type != "generate":
                return msg_type, Body(msg_type, raw), None
            token_ids = raw.get("prompt_token_ids")
            if isinstance(token_ids, list):   # before checking millions of ids one by one
                self.engine.inputs.check_count(len(token_ids), self.engine.facts)
            request = m.GenerateRequest.decode(Body(msg_type, raw))
        except ProtocolError as error:
            return "malformed", client_id, error
        except InputError as error:
            return "too_long", client_id, str(error)
        try:
            return "generate", request, self._prepare(request)
        except ValueError as error:
            return "refused", request, error
        except Exception as error:   # a tokenizer failure must still be answered
            log.exception("could not prepare request %r", request.id)
            return "refused", request, f"could not prepare the prompt: {error}"

    async def _on_large(self, client: bytes, job: asyncio.Future) -> None:
        try:
            kind, what, detail = await job
            if kind == "malformed":   # a job kind, not a code: answered as invalid
                self._bad_message(client, what, detail)
            elif kind == "too_long":
                self.reply(client, m.encode_error(what, RefusalCode.INVALID, detail), what)
            elif kind not in ("generate", "refused"):
                self._dispatch(client, kind, what)
            elif (client, what.id) in self.early_aborts:   # aborted while prepared
                self.early_aborts.discard((client, what.id))
                self.reply(client, m.encode_final(what.id, "", [], FinishReason.ABORT, 0),
                           what.id)
            elif not self._refused(client, what):
                if kind == "refused":
                    self.reply(client, m.encode_error(what.id, RefusalCode.INVALID,
                                                      str(detail)), what.id)
                else:
                    self._start(client, what, detail)
        except ProtocolError as error:
            self._bad_message(client, "", error)
        finally:
            self._prepared(client)

    def _prepared(self, client: bytes) -> None:
        """One of this client's requests is no longer being prepared (pool or admission)."""
        left = self.preparing[client] - 1
        if left:
            self.preparing[client] = left
        else:   # nothing of this client is being prepared: its early aborts are moot
            del self.preparing[client]
            self.early_aborts = {k for k in self.early_aborts if k[0] != client}

    def _refused(self, client: bytes, request: m.GenerateRequest) -> bool:
        """Refuse (and answer) a generate that cannot be served now."""
        reason = None
        running = self.by_client.get(client, {})
        if client in self.cut_off:
            return True   # a large request prepared while it was cut off: nobody to answer
        if request.id in running:
            reason = (RefusalCode.INVALID, f"request id {request.id!r} is already running")
        elif self.peers.load(client) >= self.max_requests:
            reason = self._at_cap(client)
        elif self.engine.draining:
            reason = (RefusalCode.SHUTTING_DOWN,
                      "the server is shutting down; retry elsewhere or later")
        elif not self.engine.engine_alive:
            reason = (RefusalCode.ENGINE_DEAD, self.engine.dead_reason())
        elif request.params.lora is not None and request.params.lora not in self.engine.loras:
            reason = (RefusalCode.INVALID, f"no LoRA adapter named {request.params.lora!r} "
                      f"is loaded (loaded: {', '.join(self.engine.loras) or 'none'})")
        elif runner_problem(self.engine, request.pooling) is not None:
            reason = (RefusalCode.INVALID, runner_problem(self.engine, request.pooling))
        elif self.priority_floor is not None and \
                priority_problem(request.params.priority, self.priority_floor, False):
            reason = (RefusalCode.INVALID, priority_problem(request.params.priority,
                                                            self.priority_floor, False))
        if reason is not None:
            self.reply(client, m.encode_error(request.id, *reason), request.id)
        return reason is not None

    def _prepare(self, request: m.GenerateRequest) -> ProcessedPrompt:
        """Prompt ids and stop tables of a generate, checked by the input processor (the
        HTTP API's and folio.LLM's too); an InputError (a ValueError) refuses it."""
        if request.pooling is not None:   # embed or score (frontend/openai/pooling/)
            return prepare_pooled(self.engine, request)
        return self.engine.inputs.process(
            request.params, self.engine.facts, prompt=request.prompt,
            token_ids=request.prompt_token_ids, messages=request.messages)

    def _start(self, client: bytes, request: m.GenerateRequest,
               prepared: ProcessedPrompt) -> None:
        if request.params.structured_output is not None:   # refused here, not in the engine
            self.preparing[client] = self.preparing.get(client, 0) + 1
            asyncio.create_task(self._admit_then_start(client, request, prepared))
            return
        self._submit(client, request, prepared)

    async def _admit_then_start(self, client: bytes, request: m.GenerateRequest,
                                prepared: ProcessedPrompt) -> None:
        """A structured request's grammar is admitted as over HTTP: off the event loop and
        within the grammar budget (frontend/structured_output_admission.py), then it starts."""
        try:
            error = await self.engine.grammars.check([request.params.structured_output])
            if (client, request.id) in self.early_aborts:   # aborted while admitted
                self.early_aborts.discard((client, request.id))
                self.reply(client, m.encode_final(request.id, "", [], FinishReason.ABORT, 0),
                           request.id)
            elif error is not None:
                self.reply(client, m.encode_error(
                    request.id, RefusalCode.INVALID,
                    "structured_output: " + " ".join(error.split())[:500]),
                    request.id)
            elif not self._refused(client, request):   # the state may have moved meanwhile
                self._submit(client, request, prepared)
        finally:
            self._prepared(client)

    def _submit(self, client: bytes, request: m.GenerateRequest,
                prepared: ProcessedPrompt) -> None:
        sink = _ClientSink(self, client, request.id, request.stream,
                           None if request.pooling is None
                           else pooled_answer(self.engine, request))
        self.by_client.setdefault(client, {})[request.id] = self.engine.submit(
            prepared.ids, request.params, sink, request.deadline, prepared.stops,
            f"sdk:{self.peers.client(client)}")
        self.peers.started(client)

    async def _on_health(self, client: bytes, client_id: str) -> None:
        engine = self.engine
        stats = await engine.stats()
        self.reply(client, m.encode_health(
            client_id, ok=engine.engine_alive and not engine.draining, draining=engine.draining,
            scheduler=engine.scheduler_alive, executor=engine.engine_alive,
            frontend_id=engine.frontend_id, stats=stats,
            replicas=engine.replica_health()),
            client_id)

    async def _on_kv_map(self, client: bytes, client_id: str) -> None:
        self.reply(client, m.encode_kv_map(await self.engine.kv_map(), client_id), client_id)

    def forget(self, client: bytes, client_id: str) -> None:
        running = self.by_client.get(client)
        if running is not None:
            if running.pop(client_id, None) is not None:
                self.peers.ended(client)
            if not running:
                del self.by_client[client]

    def reply(self, client: bytes, payload: bytes, client_id: str = "") -> None:
        """Send to a client now (NOBLOCK: replies keep their order). A cut-off client's
        output is dropped; one that cannot take it is cut off or, gone, forgotten.
        `client_id`: the request this reply ends, told again if it is lost."""
        if client in self.cut_off:
            return
        error = send_now(self.sock, [client, payload])
        if error is not None:
            self._unreachable(client, error, client_id)

    def _unreachable(self, client: bytes, error: BaseException, client_id: str) -> None:
        """Abort, once, every request of a client that can no longer be answered."""
        running = self.by_client.pop(client, {})
        if running:
            self.peers.ended(client, len(running))
        for request_id in running.values():
            self.engine.abort(request_id)
        if _gone(error):
            self.cut_off.remove(client)
            self.gone.add(client)
            if running:
                log.info("client %s left: aborted its %d request(s)", client.hex(),
                         len(running))
            return
        lost = [*running, client_id] if client_id and client_id not in running else [*running]
        self.cut_off.add(client, lost, room=self.max_requests)
        log.warning("client %s does not read its replies (its queue is full: %s): aborted its "
                    "%d request(s); its messages are dropped until it reads again",
                    client.hex(), error, len(running))

    def _served_again(self, client: bytes, data: bytes) -> bool:
        """A message from a cut-off client: True when the client took every notice (it
        reads again) and this message is to be served; else it is dropped, and the client
        told of it later if it asks for an answer and there is room."""
        if self.cut_off.may_try(client) and self._tell_cut_off(client):
            return True
        if self.cut_off.has_room(client) and self.engine.prep.small(len(data)):
            client_id = _answered_id(data, ("generate", "health", "kv_map"))
            if client_id is not None:
                self.cut_off.dropped(client, client_id)
        return False

    def _tell_cut_off(self, client: bytes) -> bool:
        """Try to tell a cut-off client which of its requests were aborted or dropped; True
        once it took every notice (it reads again: served as any client from now on)."""
        notices = self.cut_off.notices(client)
        while notices:
            error = send_now(self.sock, [client, m.encode_error(
                notices[-1], RefusalCode.SLOW_READER,
                "this connection fell behind reading its replies and its queue filled up: "
                "the request was aborted (or dropped unread); read replies as they come")])
            if error is not None:
                if _gone(error):
                    self.cut_off.remove(client)
                    self.gone.add(client)
                return False
            notices.pop()
        self.cut_off.remove(client)
        log.info("client %s reads its replies again", client.hex())
        return True

    async def _retry_cut_off(self) -> None:
        """A cut-off client that reads again but sends nothing still hears of its requests."""
        while True:
            await asyncio.sleep(CUT_OFF_RETRY_S)
            for client in self.cut_off.clients():
                if self.cut_off.may_try(client):
                    self._tell_cut_off(client)


def _answered_id(data: bytes, types: tuple[str, ...]) -> str | None:
    """The id of a message of one of `types` that has a readable one; None otherwise."""
    try:
        msg_type, raw = unpack(data)
    except ProtocolError:
        return None
    client_id = raw.get("id")
    if msg_type in types and isinstance(client_id, str) and 0 < len(client_id) <= MAX_ID_LEN:
        return client_id
    return None


def _gone(error: BaseException) -> bool:
    """A ROUTER_MANDATORY send's error for a peer that is no longer connected."""
    return isinstance(error, zmq.ZMQError) and error.errno == zmq.EHOSTUNREACH


def client_socket(ctx: zmq.asyncio.Context, limits: ClientLimits = ClientLimits()
                  ) -> zmq.asyncio.Socket:
    """The clients' ROUTER. No ZMTP heartbeats of its own: libzmq 4.3.5 (and master) aborts
    the process when a heartbeat timer fires on a connection whose peer hung up while its
    receive queue was full (assert !_io_error in stream_engine_base.cpp: libzmq issues 3937,
    4364, 4841), which any client could do by flooding and leaving. SDK clients ping with a
    TTL, so one that goes silent is still dropped after HEARTBEAT_TIMEOUT_MS; one that does
    not read is cut off when its queue fills. Options apply to connections accepted after
    the bind only: set them all before it."""
    sock = configure(ctx.socket(zmq.ROUTER))
    sock.setsockopt(zmq.HEARTBEAT_IVL, 0)
    sock.setsockopt(zmq.SNDHWM, limits.send_queue)
    if limits.send_buffer is not None:
        sock.setsockopt(zmq.SNDBUF, limits.send_buffer)
    sock.setsockopt(zmq.ROUTER_MANDATORY, 1)
    return sock
