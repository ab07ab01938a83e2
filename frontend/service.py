"""The frontend process: text in, text out.

It binds the client socket (ROUTER; the SDK connects with DEALER), tokenizes and validates
requests, forwards token ids to the scheduler (DEALER to the scheduler's ROUTER), and turns
the scheduler's per-step token ids back into text, streamed or whole.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import os
import signal
import time
import uuid
from dataclasses import dataclass, field
from typing import Any

import zmq
import zmq.asyncio

from frontend.output_text import OutputText
from frontend.tokenizer import load_tokenizer
from shared import messages as m
from shared.outputs import EngineOutput
from shared.sampling_params import check_against_model
from shared.transport import (DOWN_EVENTS, UP_EVENTS, check_bind_address, configure,
                              monitor_socket)
from shared.wire import ProtocolError
from zmq.utils.monitor import parse_monitor_message

log = logging.getLogger("folio.frontend")

SCHEDULER_TYPES = frozenset({"engine_info", "outputs", "rejected", "stats", "error"})
SCHEDULER_TIMEOUT_S = 2.0
HEARTBEAT_S = 0.5


@dataclass(frozen=True)
class FrontendConfig:
    model: str                 # directory holding the tokenizer files
    client_address: str
    scheduler_address: str


@dataclass
class _Request:
    client: bytes
    client_id: str
    stream: bool
    prompt_len: int
    text: OutputText
    want_logprobs: bool
    token_ids: list[int] = field(default_factory=list)
    logprobs: list[dict[str, Any]] = field(default_factory=list)
    prompt_ids: list[int] = field(default_factory=list)
    prompt_logprobs: list[dict[str, Any]] | None = None


class FrontendService:
    def __init__(self, config: FrontendConfig) -> None:
        self.config = config
        self.tokenizer = load_tokenizer(config.model)
        self.frontend_id = f"fe-{os.getpid()}-{uuid.uuid4().hex[:6]}"
        self.ctx = zmq.asyncio.Context()
        self.client_sock = configure(self.ctx.socket(zmq.ROUTER))
        self.client_sock.setsockopt(zmq.ROUTER_MANDATORY, 1)
        self.client_sock.bind(check_bind_address(config.client_address))
        self.sched_sock = configure(self.ctx.socket(zmq.DEALER))
        self.sched_sock.setsockopt(zmq.IDENTITY, self.frontend_id.encode())
        self.sched_monitor = monitor_socket(self.sched_sock)   # before connect
        self.sched_sock.connect(config.scheduler_address)
        self.requests: dict[str, _Request] = {}
        self.by_client: dict[tuple[bytes, str], str] = {}
        self.counter = itertools.count()
        self.info: m.EngineInfo | None = None
        self.scheduler_seen = 0.0
        self.health_waiters: list[asyncio.Future] = []
        self.stopped = asyncio.Event()

    @property
    def scheduler_alive(self) -> bool:
        return time.monotonic() - self.scheduler_seen < SCHEDULER_TIMEOUT_S

    @property
    def engine_alive(self) -> bool:
        return self.scheduler_alive and self.info is not None and self.info.executor_alive

    async def run(self) -> None:
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, self.stopped.set)
        log.info("frontend %s: clients connect to %s", self.frontend_id,
                 self.config.client_address)
        tasks = [asyncio.create_task(coro) for coro in (
            self._client_loop(), self._scheduler_loop(), self._watch_scheduler(),
            self._heartbeat_loop())]
        await self.stopped.wait()
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        self.client_sock.close(0)
        self.sched_sock.close(0)
        self.ctx.term()

    # ---- clients ------------------------------------------------------------------------

    async def _client_loop(self) -> None:
        while True:
            frames = await self.client_sock.recv_multipart()
            if len(frames) != 2:
                continue
            client, data = frames
            try:
                msg_type, body = m.decode(data, m.CLIENT_TYPES)
                if msg_type == "generate":
                    self._on_generate(client, m.GenerateRequest.decode(body))
                elif msg_type == "abort":
                    self._on_abort(client, body.str("id"))
                elif msg_type == "health":
                    asyncio.create_task(self._on_health(client, body.str("id")))
            except ProtocolError as error:
                log.warning("bad client message: %s", error)
                request_id = m.peek_id(data)
                await self._send_client(client, m.encode_error(request_id, "invalid", str(error)))

    def _on_generate(self, client: bytes, request: m.GenerateRequest) -> None:
        key = (client, request.id)
        if key in self.by_client:
            self._reply(client, m.encode_error(request.id, "invalid",
                                               f"request id {request.id!r} is already running"))
            return
        if not self.engine_alive:
            self._reply(client, m.encode_error(request.id, "engine_dead", self._dead_reason()))
            return
        if request.params.n != 1:
            self._reply(client, m.encode_error(
                request.id, "invalid", "n > 1 is not served over the SDK yet; send n "
                "requests, or use folio.LLM"))
            return
        try:
            prompt_ids = self._tokenize(request)
            check_against_model(request.params, self.info.vocab_size if self.info else
                                len(self.tokenizer))
        except ValueError as error:
            self._reply(client, m.encode_error(request.id, "invalid", str(error)))
            return
        request_id = f"{self.frontend_id}-{next(self.counter)}"
        self.requests[request_id] = _Request(client, request.id, request.stream,
                                             len(prompt_ids),
                                             OutputText(self.tokenizer, request.params),
                                             request.params.logprobs is not None,
                                             prompt_ids=prompt_ids,
                                             prompt_logprobs=None if
                                             request.params.prompt_logprobs is None else [])
        self.by_client[key] = request_id
        self._send_scheduler(m.encode_add(request_id, prompt_ids, request.params))

    def _tokenize(self, request: m.GenerateRequest) -> list[int]:
        if request.messages is not None:
            if not getattr(self.tokenizer, "chat_template", None):
                raise ValueError("this model's tokenizer has no chat template; send 'prompt'")
            try:
                ids = self.tokenizer.apply_chat_template(request.messages,
                                                         add_generation_prompt=True,
                                                         tokenize=True)
            except Exception as error:   # template errors come from jinja as many types
                raise ValueError(f"chat template failed: {error}") from None
            if isinstance(ids, dict) or hasattr(ids, "keys"):
                ids = ids["input_ids"]
            ids = list(ids)
        elif request.prompt is not None:
            ids = self.tokenizer.encode(request.prompt, add_special_tokens=True)
        else:
            ids = list(request.prompt_token_ids or [])
            vocab = self.info.vocab_size if self.info else len(self.tokenizer)
            bad = [t for t in ids if t >= vocab]
            if bad:
                raise ValueError(f"prompt token id {bad[0]} is outside the vocabulary "
                                 f"[0, {vocab})")
        if not ids:
            raise ValueError("prompt must contain at least one token")
        limit = self.info.max_model_len if self.info else None
        if limit is not None and len(ids) > limit:
            raise ValueError(f"prompt has {len(ids)} tokens, more than max_model_len = {limit}")
        return ids

    def _on_abort(self, client: bytes, client_id: str) -> None:
        request_id = self.by_client.get((client, client_id))
        if request_id is not None:
            self._send_scheduler(m.encode_abort(request_id))

    async def _on_health(self, client: bytes, client_id: str) -> None:
        stats: dict[str, Any] = {}
        if self.scheduler_alive:
            waiter = asyncio.get_running_loop().create_future()
            self.health_waiters.append(waiter)
            self._send_scheduler(m.pack("stats_request", {}))
            try:
                stats = await asyncio.wait_for(waiter, timeout=1.0)
            except asyncio.TimeoutError:
                stats = {}
        await self._send_client(client, m.pack("health", {
            "id": client_id, "ok": self.engine_alive, "scheduler": self.scheduler_alive,
            "executor": self.engine_alive, "frontend_id": self.frontend_id, "stats": stats}))

    # ---- scheduler ----------------------------------------------------------------------

    async def _scheduler_loop(self) -> None:
        while True:
            data = await self.sched_sock.recv()
            try:
                msg_type, body = m.decode(data, SCHEDULER_TYPES)
            except ProtocolError as error:
                log.warning("bad scheduler message: %s", error)
                continue
            self.scheduler_seen = time.monotonic()
            try:
                if msg_type == "outputs":
                    for output in m.decode_outputs(body):
                        self._on_output(output)
                elif msg_type == "engine_info":
                    self._on_engine_info(m.EngineInfo.decode(body))
                elif msg_type == "rejected":
                    self._finish_with_error(body.str("id"), body.str("code", 32),
                                            body.str("message", 4000))
                elif msg_type == "stats":
                    stats = body.map("stats")
                    waiters, self.health_waiters = self.health_waiters, []
                    for waiter in waiters:
                        if not waiter.done():
                            waiter.set_result(stats)
            except ProtocolError as error:
                log.warning("bad scheduler message: %s", error)

    def _on_engine_info(self, info: m.EngineInfo) -> None:
        was_alive = self.info is not None and self.info.executor_alive
        self.info = info
        if was_alive and not info.executor_alive:
            self._fail_all("the executor is gone; the engine cannot serve requests")

    def _on_output(self, output: EngineOutput) -> None:
        request = self.requests.get(output.request_id)
        if request is None:
            return
        if output.error is not None:
            self._finish_with_error(output.request_id, "engine_dead", output.error)
            return
        if output.prompt_logprobs is not None and request.prompt_logprobs is not None:
            start = len(request.prompt_logprobs) + 1
            request.prompt_logprobs.extend(
                self._logprob_entry(request.prompt_ids[start + i], entry)
                for i, entry in enumerate(output.prompt_logprobs))
        new_ids = output.new_token_ids
        request.token_ids.extend(new_ids)
        entries = []
        if request.want_logprobs and output.logprobs is not None:
            entries = [self._logprob_entry(t, e) for t, e in zip(new_ids, output.logprobs)]
            request.logprobs.extend(entries)
        delta = request.text.add(new_ids, final=output.finished)
        stopped = request.text.stopped
        if request.stream and (delta or new_ids):
            self._reply(request.client, m.encode_delta(request.client_id, delta, new_ids,
                                                       entries or None))
        if stopped or output.finished:
            self._forget(output.request_id)
            if stopped and not output.finished:
                self._send_scheduler(m.encode_abort(output.request_id))   # free it now
            self._reply(request.client, m.encode_final(
                request.client_id, request.text.text, request.token_ids,
                "stop" if stopped else output.finish_reason, request.prompt_len,
                request.logprobs if request.want_logprobs else None,
                request.text.stop_string, request.prompt_logprobs))

    def _logprob_entry(self, token_id: int, entry) -> dict[str, Any]:
        logprob, rank, top_ids, top_logprobs = entry
        return {"token_id": token_id, "logprob": logprob, "rank": rank,
                "decoded_token": self.tokenizer.decode([token_id]),
                "top": [[tid, lp, self.tokenizer.decode([tid])]
                        for tid, lp in zip(top_ids, top_logprobs)]}

    def _finish_with_error(self, request_id: str, code: str, message: str) -> None:
        request = self.requests.get(request_id)
        if request is None:
            return
        self._forget(request_id)
        self._reply(request.client, m.encode_error(request.client_id, code, message))

    def _fail_all(self, reason: str) -> None:
        for request_id in list(self.requests):
            self._finish_with_error(request_id, "engine_dead", reason)

    def _forget(self, request_id: str) -> None:
        request = self.requests.pop(request_id)
        self.by_client.pop((request.client, request.client_id), None)

    def _dead_reason(self) -> str:
        if not self.scheduler_alive:
            return "the scheduler is not reachable"
        return "the executor is not running"

    async def _watch_scheduler(self) -> None:
        monitor = self.sched_monitor
        try:
            while True:
                try:
                    frames = await asyncio.wait_for(monitor.recv_multipart(), timeout=0.2)
                    event = parse_monitor_message(frames)["event"]
                    if event & DOWN_EVENTS:
                        self.scheduler_seen = 0.0
                    elif event & UP_EVENTS:
                        self._send_scheduler(m.pack("frontend_hello", {"id": self.frontend_id}))
                except asyncio.TimeoutError:
                    pass
                if self.requests and not self.scheduler_alive:
                    self._fail_all("the scheduler is not responding")
        finally:
            monitor.close(0)

    async def _heartbeat_loop(self) -> None:
        beat = m.encode_heartbeat(os.getpid())
        while True:
            self._send_scheduler(beat)
            await asyncio.sleep(HEARTBEAT_S)

    # ---- sending ------------------------------------------------------------------------

    def _send_scheduler(self, payload: bytes) -> None:
        try:
            self.sched_sock.send(payload, zmq.NOBLOCK)
        except zmq.ZMQError as error:
            log.warning("could not reach the scheduler: %s", error)

    def _reply(self, client: bytes, payload: bytes) -> None:
        # NOBLOCK sends complete (or fail) at once, so replies keep their order.
        sent = self.client_sock.send_multipart([client, payload], zmq.NOBLOCK)
        sent.add_done_callback(lambda future: self._check_sent(future, client))

    async def _send_client(self, client: bytes, payload: bytes) -> None:
        self._reply(client, payload)

    def _check_sent(self, future: asyncio.Future, client: bytes) -> None:
        if not future.cancelled() and future.exception() is not None:
            self._drop_client(client)

    def _drop_client(self, client: bytes) -> None:
        """A vanished client: abort its requests so their blocks come back."""
        for (owner, _), request_id in list(self.by_client.items()):
            if owner == client:
                self._send_scheduler(m.encode_abort(request_id))


def serve_frontend(config: FrontendConfig) -> None:
    async def main() -> None:
        await FrontendService(config).run()

    try:
        import uvloop
    except ImportError:   # uvloop is optional off Linux
        asyncio.run(main())
    else:
        uvloop.run(main())
