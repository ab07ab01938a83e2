"""The ZeroMQ gateway: the SDK's client socket (ROUTER) in front of the engine client.

Small messages are handled on the event loop as they come. A large one (a long prompt or
chat) is decoded and tokenized in the engine client's preparation pool (frontend/prep.py);
an `abort` that arrives meanwhile for it is remembered and applied when it is ready.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any

import zmq
import zmq.asyncio

from frontend.engine_client import EngineClient, FinalResult
from frontend.prompts import check_prompt, prompt_ids
from frontend.stop_strings import StopStrings
from shared import messages as m
from shared.codes import FinishReason, RefusalCode
from shared.sampling_params import check_against_model
from shared.structured_output import grammar_error
from shared.security import CurveKeys, make_server
from shared.transport import check_bind_address, configure
from shared.wire import MAX_ID_LEN, MAX_MESSAGE_BYTES, Body, ProtocolError, unpack

log = logging.getLogger("folio.frontend")
MAX_EARLY_ABORTS = 1024   # aborts kept for requests still being prepared


class _ClientSink:
    def __init__(self, gateway: "ZmqGateway", client: bytes, client_id: str,
                 stream: bool) -> None:
        self.gateway, self.client, self.client_id, self.stream = (gateway, client, client_id,
                                                                  stream)

    def delta(self, index: int, text: str, token_ids: list[int],
              logprobs: list[dict[str, Any]] | None) -> None:
        if self.stream:
            self.gateway.reply(self.client, m.encode_delta(self.client_id, text, token_ids,
                                                           logprobs))

    def final(self, result: FinalResult) -> None:
        self.gateway.forget(self.client, self.client_id)
        sample = result.samples[0]
        payload = m.encode_final(
            self.client_id, sample.text, sample.token_ids, sample.finish_reason,
            result.prompt_tokens, sample.logprobs, sample.stop_reason, result.prompt_logprobs)
        if len(payload) > MAX_MESSAGE_BYTES:   # the client's socket would drop the connection
            payload = m.encode_error(self.client_id, RefusalCode.INVALID, (
                f"the result ({len(payload)} bytes) exceeds the {MAX_MESSAGE_BYTES}-byte "
                "message limit; ask for fewer tokens or logprobs"))
        self.gateway.reply(self.client, payload)

    def error(self, code: str, message: str) -> None:
        self.gateway.forget(self.client, self.client_id)
        self.gateway.reply(self.client, m.encode_error(self.client_id, code, message))


class ZmqGateway:
    def __init__(self, engine: EngineClient, address: str, ctx: zmq.asyncio.Context,
                 keys: CurveKeys | None = None) -> None:
        self.engine = engine
        self.address = address
        self.sock = make_server(configure(ctx.socket(zmq.ROUTER)), keys)
        self.sock.setsockopt(zmq.ROUTER_MANDATORY, 1)
        self.sock.bind(check_bind_address(address))
        self.by_client: dict[tuple[bytes, str], str] = {}
        self.preparing: dict[bytes, int] = {}          # client -> large messages in the pool
        self.early_aborts: set[tuple[bytes, str]] = set()

    def close(self) -> None:
        self.sock.close(0)

    async def serve(self) -> None:
        received = 0
        prep = self.engine.prep
        while True:
            frames = await self.sock.recv_multipart()
            received += 1
            if received % 64 == 0:
                # A ready socket never suspends the await above: let the other tasks
                # (scheduler link, HTTP) run during a burst.
                await asyncio.sleep(0)
            if len(frames) != 2:
                continue
            client, data = frames
            if prep.small(len(data)):
                self._on_message(client, data)
                continue
            await prep.reserve()   # the pool is full: leave the rest queued in the socket
            self.preparing[client] = self.preparing.get(client, 0) + 1
            asyncio.create_task(self._on_large(client, prep.submit(self._decode_large, data)))

    def _on_message(self, client: bytes, data: bytes) -> None:
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
                                                      str(error)))
                    return
                self._start(client, request, *prepared)
        elif msg_type == "abort":
            client_id = m.decode_client_query(body).request_id
            request_id = self.by_client.get((client, client_id))
            if request_id is not None:
                self.engine.abort(request_id)
            elif self.preparing.get(client) and len(self.early_aborts) < MAX_EARLY_ABORTS:
                self.early_aborts.add((client, client_id))
        elif msg_type == "health":
            asyncio.create_task(self._on_health(client, m.decode_client_query(body).request_id))
        elif msg_type == "kv_map":
            asyncio.create_task(self._on_kv_map(client, m.decode_client_query(body).request_id))

    def _bad_message(self, client: bytes, client_id: str, error: ProtocolError) -> None:
        log.warning("bad client message: %s", error)
        self.reply(client, m.encode_error(client_id, RefusalCode.INVALID, str(error)))

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
            too_long = self._too_long(raw.get("prompt_token_ids"))
            if too_long is not None:   # before checking millions of ids one by one
                return "too_long", client_id, too_long
            request = m.GenerateRequest.decode(Body(msg_type, raw))
        except ProtocolError as error:
            return "malformed", client_id, error
        try:
            return "generate", request, self._prepare(request)
        except ValueError as error:
            return "refused", request, error
        except Exception as error:   # a tokenizer failure must still be answered
            log.exception("could not prepare request %r", request.id)
            return "refused", request, f"could not prepare the prompt: {error}"

    def _too_long(self, token_ids) -> str | None:
        limit = self.engine.max_model_len
        if isinstance(token_ids, list) and limit is not None and len(token_ids) > limit:
            return (f"prompt has {len(token_ids)} tokens, more than this model's maximum "
                    f"context length max_model_len = {limit}")
        return None

    async def _on_large(self, client: bytes, job: asyncio.Future) -> None:
        try:
            kind, what, detail = await job
            if kind == "malformed":   # a job kind, not a code: answered as invalid
                self._bad_message(client, what, detail)
            elif kind == "too_long":
                self.reply(client, m.encode_error(what, RefusalCode.INVALID, detail))
            elif kind not in ("generate", "refused"):
                self._dispatch(client, kind, what)
            elif (client, what.id) in self.early_aborts:   # aborted while prepared
                self.early_aborts.discard((client, what.id))
                self.reply(client, m.encode_final(what.id, "", [], FinishReason.ABORT, 0))
            elif not self._refused(client, what):
                if kind == "refused":
                    self.reply(client, m.encode_error(what.id, RefusalCode.INVALID,
                                                      str(detail)))
                else:
                    self._start(client, what, *detail)
        except ProtocolError as error:
            self._bad_message(client, "", error)
        finally:
            left = self.preparing[client] - 1
            if left:
                self.preparing[client] = left
            else:   # nothing of this client is being prepared: its early aborts are moot
                del self.preparing[client]
                self.early_aborts = {k for k in self.early_aborts if k[0] != client}

    def _refused(self, client: bytes, request: m.GenerateRequest) -> bool:
        """Refuse (and answer) a generate that cannot be served now."""
        reason = None
        if (client, request.id) in self.by_client:
            reason = (RefusalCode.INVALID, f"request id {request.id!r} is already running")
        elif self.engine.draining:
            reason = (RefusalCode.SHUTTING_DOWN,
                      "the server is shutting down; retry elsewhere or later")
        elif not self.engine.engine_alive:
            reason = (RefusalCode.ENGINE_DEAD, self.engine.dead_reason())
        elif request.params.n != 1:
            reason = (RefusalCode.INVALID, "n > 1 is not served over the SDK yet; send n "
                      "requests, or use the HTTP API or folio.LLM")
        if reason is not None:
            self.reply(client, m.encode_error(request.id, *reason))
        return reason is not None

    def _prepare(self, request: m.GenerateRequest) -> tuple[list[int], StopStrings | None]:
        """Prompt ids and stop tables of a generate (ValueError: refuse it)."""
        engine = self.engine
        engine.check_text_size(len(request.prompt or "") + sum(
            len(message["content"]) for message in request.messages or ()))
        ids = prompt_ids(engine.tokenizer, prompt=request.prompt,
                         token_ids=request.prompt_token_ids, messages=request.messages)
        check_prompt(ids, engine.vocab_size, engine.max_model_len)
        limit = engine.max_model_len
        if limit is not None and request.params.max_tokens is None and len(ids) >= limit:
            raise ValueError(f"prompt has {len(ids)} tokens, leaving no room for a generated "
                             f"token under this model's max_model_len = {limit}")
        check_against_model(request.params, engine.vocab_size, *engine.limits)
        if request.params.structured_output is not None:   # refused here, not in the engine
            error = grammar_error(request.params.structured_output)
            if error is not None:
                raise ValueError("structured_output cannot be compiled: "
                                 + " ".join(error.split())[:500])
        return ids, StopStrings(request.params.stop) if request.params.stop else None

    def _start(self, client: bytes, request: m.GenerateRequest, ids: list[int],
               stops: StopStrings | None) -> None:
        sink = _ClientSink(self, client, request.id, request.stream)
        self.by_client[(client, request.id)] = self.engine.submit(
            ids, request.params, sink, request.deadline, stops)

    async def _on_health(self, client: bytes, client_id: str) -> None:
        engine = self.engine
        stats = await engine.stats()
        self.reply(client, m.encode_health(
            client_id, ok=engine.engine_alive and not engine.draining, draining=engine.draining,
            scheduler=engine.scheduler_alive, executor=engine.engine_alive,
            frontend_id=engine.frontend_id, stats=stats,
            replicas=engine.replica_health() if hasattr(engine, "replica_health") else None))

    async def _on_kv_map(self, client: bytes, client_id: str) -> None:
        self.reply(client, m.encode_kv_map(await self.engine.kv_map(), client_id))

    def forget(self, client: bytes, client_id: str) -> None:
        self.by_client.pop((client, client_id), None)

    def reply(self, client: bytes, payload: bytes) -> None:
        # NOBLOCK sends complete (or fail) at once, so replies keep their order.
        sent = self.sock.send_multipart([client, payload], zmq.NOBLOCK)
        sent.add_done_callback(lambda future: self._check_sent(future, client))

    def _check_sent(self, future: asyncio.Future, client: bytes) -> None:
        if not future.cancelled() and future.exception() is not None:
            # A vanished client: abort its requests so their blocks come back.
            for (owner, _), request_id in list(self.by_client.items()):
                if owner == client:
                    self.engine.abort(request_id)
