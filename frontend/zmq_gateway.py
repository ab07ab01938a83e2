"""The ZeroMQ gateway: the SDK's client socket (ROUTER) in front of the engine client."""

from __future__ import annotations

import asyncio
import logging
from typing import Any

import zmq
import zmq.asyncio

from frontend.engine_client import EngineClient, FinalResult
from frontend.prompts import check_prompt, prompt_ids
from shared import messages as m
from shared.sampling_params import check_against_model
from shared.security import CurveKeys, make_server
from shared.transport import check_bind_address, configure
from shared.wire import ProtocolError

log = logging.getLogger("folio.frontend")


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
        self.gateway.reply(self.client, m.encode_final(
            self.client_id, sample.text, sample.token_ids, sample.finish_reason,
            result.prompt_tokens, sample.logprobs, sample.stop_reason, result.prompt_logprobs))

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

    def close(self) -> None:
        self.sock.close(0)

    async def serve(self) -> None:
        received = 0
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
            try:
                msg_type, body = m.decode(data, m.CLIENT_TYPES)
                if msg_type == "generate":
                    self._on_generate(client, m.GenerateRequest.decode(body))
                elif msg_type == "abort":
                    request_id = self.by_client.get((client, body.str("id")))
                    if request_id is not None:
                        self.engine.abort(request_id)
                elif msg_type == "health":
                    asyncio.create_task(self._on_health(client, body.str("id")))
            except ProtocolError as error:
                log.warning("bad client message: %s", error)
                self.reply(client, m.encode_error(m.peek_id(data), "invalid", str(error)))

    def _on_generate(self, client: bytes, request: m.GenerateRequest) -> None:
        key = (client, request.id)
        if key in self.by_client:
            self.reply(client, m.encode_error(request.id, "invalid",
                                              f"request id {request.id!r} is already running"))
            return
        if self.engine.draining:
            self.reply(client, m.encode_error(request.id, "shutting_down",
                                              "the server is shutting down; retry elsewhere "
                                              "or later"))
            return
        if not self.engine.engine_alive:
            self.reply(client, m.encode_error(request.id, "engine_dead",
                                              self.engine.dead_reason()))
            return
        if request.params.n != 1:
            self.reply(client, m.encode_error(
                request.id, "invalid", "n > 1 is not served over the SDK yet; send n "
                "requests, or use the HTTP API or folio.LLM"))
            return
        try:
            ids = prompt_ids(self.engine.tokenizer, prompt=request.prompt,
                             token_ids=request.prompt_token_ids, messages=request.messages)
            check_prompt(ids, self.engine.vocab_size, self.engine.max_model_len)
            check_against_model(request.params, self.engine.vocab_size, *self.engine.limits)
        except ValueError as error:
            self.reply(client, m.encode_error(request.id, "invalid", str(error)))
            return
        sink = _ClientSink(self, client, request.id, request.stream)
        self.by_client[key] = self.engine.submit(ids, request.params, sink, request.deadline)

    async def _on_health(self, client: bytes, client_id: str) -> None:
        stats = await self.engine.stats()
        self.reply(client, m.pack("health", {
            "id": client_id, "ok": self.engine.engine_alive and not self.engine.draining,
            "draining": self.engine.draining,
            "scheduler": self.engine.scheduler_alive, "executor": self.engine.engine_alive,
            "frontend_id": self.engine.frontend_id, "stats": stats}))

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
