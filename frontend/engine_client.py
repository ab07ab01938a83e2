"""The frontend's link to the scheduler, shared by every gateway (ZeroMQ SDK, HTTP); it
implements frontend/engine_api.py's `Engine` (as the data-parallel replicas do).

A gateway submits token ids with sampling parameters and a sink; the engine client turns
the scheduler's per-step token ids into text (stop strings included) through the output
loop (frontend/output_loop.py, shared with folio.LLM), and calls the sink:
`delta` for every step (streams), then one `final` per sample, or one `error`.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import os
import time
import uuid
from dataclasses import dataclass, field
from typing import Any

import zmq
import zmq.asyncio

from folio.shared.pooling.task import PoolingTask
from folio.frontend.engine_api import FinalResult, SampleResult, Sink
from folio.frontend.link_resume import RESUME_WAIT_S, LinkResume
from folio.frontend.liveness import SchedulerHeartbeat
from folio.frontend.output_loop import OutputEvents, OutputLoop
from folio.frontend.output_processor import RequestState, SampleState, wire_logprob
from folio.frontend.structured_output_admission import GrammarAdmission
from folio.frontend.prep import Preparer
from folio.frontend.input_processor import InputProcessor, ModelFacts
from folio.frontend.stop_strings import StopStrings
from folio.shared.protocol import messages as m
from folio.shared.protocol.codes import RefusalCode
from folio.shared.outputs import child_request_id
from folio.shared.sampling_params import SamplingParams
from folio.shared.security import CurveKeys, make_peer
from folio.shared.transport import (DOWN_EVENTS, UP_EVENTS, Relink, configure, monitor_socket,
                              next_monitor_event, send_now)
from folio.shared.protocol.wire import ProtocolError

log = logging.getLogger("folio.frontend")

SCHEDULER_TIMEOUT_S = 3.0   # no answer to a heartbeat for this long: the scheduler is hung
HEARTBEAT_S = 0.5
STALL_S = 1.0   # the watch loop turns every 0.2 s: a longer gap means this process stalled
UNSENT_LOG_S = 5.0   # at most one "could not reach the scheduler" line this often
LOOP_SLICE_S = 0.02   # the most the scheduler loop holds the event loop before it yields


@dataclass
class _Request:
    sink: Sink
    state: RequestState   # text, token ids, logprobs, finish of each sample
    sample_ids: list[str]   # what the scheduler reports each sample under
    created: float = field(default_factory=time.monotonic)
    first_token: float | None = None
    last_token: float | None = None
    deadline: asyncio.TimerHandle | None = None


class EngineClient:
    def __init__(self, tokenizer: Any, scheduler_address: str,
                 ctx: zmq.asyncio.Context, keys: CurveKeys | None = None) -> None:
        self.tokenizer = tokenizer
        self.inputs = InputProcessor(tokenizer)   # prompts and parameters, checked
        self.frontend_id = f"fe-{os.getpid()}-{uuid.uuid4().hex[:6]}"
        # No identity of our own: the scheduler's ROUTER assigns one per connection, so no
        # peer can pose as this frontend; frontend_id is only the name its hello gives.
        self.sock = make_peer(configure(ctx.socket(zmq.DEALER)), keys)
        self.monitor = monitor_socket(self.sock)   # before connect: see the first handshake
        self.sock.connect(scheduler_address)
        self.relink = Relink(self.sock, scheduler_address)   # after an oversize message
        self.heartbeat = SchedulerHeartbeat(zmq.Context.shadow(ctx.underlying),
                                            scheduler_address, self.frontend_id, keys,
                                            HEARTBEAT_S)
        self.prep = Preparer()
        self.grammars = GrammarAdmission(tokenizer)   # structured outputs' admission
        self.requests: dict[str, _Request] = {}
        self.outputs: OutputLoop[_Request] = OutputLoop(_ClientEvents(self), self._abort_sample)
        self.counter = itertools.count()
        self.info: m.EngineInfo | None = None
        self.scheduler_seen = 0.0   # last message read on the event loop
        self.link_down_at = -1.0    # last DISCONNECTED of the scheduler socket
        self.resume = LinkResume()  # in-flight requests kept over a dropped link
        self.stats_waiters: list[asyncio.Future] = []
        self.kv_map_waiters: list[asyncio.Future] = []
        self.lora_waiters: dict[str, asyncio.Future] = {}   # by update id
        self.observers: list[Any] = []   # metrics: called with (event, request, **details)
        self.draining = False            # shutting down: gateways refuse new requests
        self.unsent = 0                  # messages the scheduler link refused since the last log
        self.unsent_logged_at = float("-inf")

    # ---- state --------------------------------------------------------------------------

    @property
    def scheduler_alive(self) -> bool:
        # The heartbeat thread's time counts even while this loop is too busy to read.
        seen = max(self.scheduler_seen, self.heartbeat.seen)
        return seen > self.link_down_at and time.monotonic() - seen < SCHEDULER_TIMEOUT_S

    @property
    def engine_alive(self) -> bool:
        return self.scheduler_alive and self.info is not None and self.info.executor_alive

    def replica_health(self) -> None:
        """One scheduler: no replicas to report."""
        return None

    def rank_health(self) -> list[dict[str, Any]]:
        """A tensor-parallel executor's ranks (none for one process). A rank that dies takes
        the group down, so every rank shares the executor's status."""
        ranks = self.info.executor_ranks if self.info else ()
        status = "ok" if self.engine_alive else "unhealthy"
        return [{"rank": rank, "pid": pid, "status": status} for rank, pid in enumerate(ranks)]

    @property
    def vocab_size(self) -> int:
        return self.info.vocab_size if self.info else len(self.tokenizer)

    @property
    def limits(self) -> tuple[int, int]:
        """(max_logprobs, max_n) as the scheduler enforces them."""
        info = self.info or m.EngineInfo(1, 1, 1, 1)   # before the first: the defaults
        return info.max_logprobs, info.max_n

    @property
    def max_model_len(self) -> int | None:
        return self.info.max_model_len if self.info else None

    @property
    def loras(self) -> tuple[str, ...]:
        return self.info.loras if self.info else ()

    @property
    def pooling(self) -> PoolingTask | None:
        pooling = self.info.pooling if self.info else None
        return None if pooling is None else PoolingTask.from_wire(pooling)

    @property
    def facts(self) -> ModelFacts:
        """What the input processor checks a request against (engine_info's figures)."""
        return ModelFacts(self.vocab_size, self.max_model_len, *self.limits)

    def check_text_size(self, chars: int) -> None:
        """InputError for text that cannot fit the context, before it is tokenized."""
        self.inputs.check_text(chars, self.facts)

    def dead_reason(self) -> str:
        if not self.scheduler_alive:
            return "the scheduler is not reachable"
        return "the executor is not running"

    def tasks(self) -> list:
        """The link's background work; starts the heartbeat thread too."""
        self.heartbeat.start()
        return [self._scheduler_loop(), self._watch_scheduler()]

    def close(self) -> None:
        self.heartbeat.stop()
        self.prep.close()
        self.grammars.close()
        self.monitor.close(0)
        self.sock.close(0)

    # ---- requests -----------------------------------------------------------------------

    def submit(self, prompt_ids: list[int], params: SamplingParams, sink: Sink,
               deadline_s: float | None = None, stops: StopStrings | None = None,
               client: str | None = None) -> str:
        """Queue a checked request; its events go to `sink`. Returns its engine id.
        With a deadline, a request not finished by then is aborted and fails with
        code "timeout". `stops`: params.stop's tables, built once per client request.
        `client`: who sent it (frontend/clients.py), for the scheduler's turns."""
        request_id = f"{self.frontend_id}-{next(self.counter)}"
        state = RequestState(self.tokenizer, params, prompt_ids, wire_logprob, stops)
        sample_ids = [child_request_id(request_id, i, params.n) for i in range(params.n)]
        request = _Request(sink, state, sample_ids)
        self.requests[request_id] = request
        self.outputs.track(request_id, request, state, sample_ids)
        if deadline_s is not None:
            request.deadline = asyncio.get_running_loop().call_later(
                deadline_s, self._expire, request_id, deadline_s)
        self._notify("submitted", request)
        if not self._send(m.encode_add(request_id, prompt_ids, params, client)):
            # Failed after the caller has the id (never inside submit): it waits for nothing.
            asyncio.get_running_loop().call_soon(
                self._fail, request_id, RefusalCode.ENGINE_DEAD,
                "could not reach the scheduler (its link is down or its queue is full)")
        return request_id

    def abort(self, request_id: str) -> None:
        if request_id in self.requests:
            self._send(m.encode_abort(request_id))

    async def stop_strings(self, params: SamplingParams) -> StopStrings | None:
        """params.stop's matching tables, built off the loop when they are long."""
        if not params.stop:
            return None
        return await self.prep.run(sum(map(len, params.stop)), self.inputs.stop_tables, params)

    def abort_all(self, reason: str) -> None:
        """Shutdown: abort every open request at the scheduler and fail it here now."""
        for request_id in list(self.requests):
            self._send(m.encode_abort(request_id))
            self._fail(request_id, RefusalCode.SHUTTING_DOWN, reason)

    async def stats(self, timeout: float = 1.0) -> dict[str, Any]:
        """The scheduler's stats. Callers that ask while a request for them is out share
        its answer: a flood of health checks or scrapes costs the scheduler one query."""
        if not self.scheduler_alive:
            return {}
        waiter = asyncio.get_running_loop().create_future()
        if not any(not w.done() for w in self.stats_waiters):
            self.stats_waiters = []   # answered or timed out: ask again
            self._send(m.encode_stats_request())
        self.stats_waiters.append(waiter)
        try:
            async with asyncio.timeout(timeout):
                return await waiter
        except TimeoutError:
            return {}

    async def kv_map(self, timeout: float = 1.0) -> dict[str, Any] | None:
        """The scheduler's page map (shared like stats); None: no executor or no answer."""
        if not self.scheduler_alive:
            return None
        waiter = asyncio.get_running_loop().create_future()
        if not any(not w.done() for w in self.kv_map_waiters):
            self.kv_map_waiters = []
            self._send(m.encode_kv_map_request())
        self.kv_map_waiters.append(waiter)
        try:
            async with asyncio.timeout(timeout):
                return await waiter
        except TimeoutError:
            return None

    async def update_lora(self, name: str, path: str | None, timeout: float = 60.0
                          ) -> str | None:
        if not self.engine_alive:
            return "the engine is not running; try again shortly"
        update_id = f"{self.frontend_id}-lora-{next(self.counter)}"
        waiter = self.lora_waiters[update_id] = asyncio.get_running_loop().create_future()
        self._send(m.encode_lora_update(update_id, name, path))
        try:
            async with asyncio.timeout(timeout):
                return await waiter
        except TimeoutError:
            return f"the engine did not answer within {timeout:g} s"
        finally:
            self.lora_waiters.pop(update_id, None)

    # ---- from the scheduler -------------------------------------------------------------

    async def _scheduler_loop(self) -> None:
        # A ready socket never suspends the recv below, and an output with a prompt's
        # log-prob tables takes milliseconds to format: past a slice of the loop's time,
        # let the other tasks (HTTP, /health, the SDK gateway) run.
        turn_started = time.monotonic()
        while True:
            data = await self.sock.recv()
            try:
                msg_type, body = m.decode(data, m.SCHEDULER_TO_FRONTEND)
                self.scheduler_seen = time.monotonic()
                if msg_type == "outputs":
                    outputs = m.decode_outputs(body)
                    if not self.resume.fresh(outputs.seq):
                        continue   # read before: sent again on a resume
                    for output in outputs.entries:
                        self.outputs.on_output(output)
                        if time.monotonic() - turn_started > LOOP_SLICE_S:
                            await asyncio.sleep(0)
                            turn_started = time.monotonic()
                    on_token = self.outputs.on_token
                    for request_id, token_id in zip(outputs.ids, outputs.tokens):
                        on_token(request_id, token_id)
                elif msg_type == "engine_info":
                    self._on_engine_info(m.EngineInfo.decode(body))
                elif msg_type == "rejected":
                    self._fail(*m.decode_rejected(body))
                elif msg_type == "frontend_dropped":
                    self._on_dropped(*m.decode_frontend_dropped(body))
                elif msg_type == "kv_map":
                    snapshot = m.decode_kv_map(body)
                    waiters, self.kv_map_waiters = self.kv_map_waiters, []
                    for waiter in waiters:
                        if not waiter.done():
                            waiter.set_result(snapshot)
                elif msg_type == "lora_updated":
                    done = m.decode_lora_updated(body)
                    waiter = self.lora_waiters.get(done.update_id)
                    if waiter is not None and not waiter.done():
                        waiter.set_result(done.error)
                elif msg_type == "stats":
                    stats = m.decode_stats(body)
                    waiters, self.stats_waiters = self.stats_waiters, []
                    for waiter in waiters:
                        if not waiter.done():
                            waiter.set_result(stats)
            except ProtocolError as error:
                log.warning("bad scheduler message: %s", error)
            if time.monotonic() - turn_started > LOOP_SLICE_S:
                await asyncio.sleep(0)
                turn_started = time.monotonic()

    def _on_engine_info(self, info: m.EngineInfo) -> None:
        was_alive = self.info is not None and self.info.executor_alive
        self.info = info
        if self.resume.on_info(info.epoch):
            log.info("the link to the scheduler is back: %d request(s) resumed",
                     len(self.requests))
        if was_alive and not info.executor_alive:
            self._fail_all("the executor is gone; the engine cannot serve requests")

    def _on_dropped(self, request_ids: list[str], reason: str) -> None:
        """The scheduler gave up on this frontend and aborted these requests."""
        log.warning("the scheduler dropped this frontend (%s): failing %d request(s)",
                    reason, len(request_ids))
        for request_id in request_ids:
            self._fail(request_id, RefusalCode.ENGINE_DEAD, f"the scheduler gave up on this "
                       f"frontend ({reason}) and aborted the request; retry it")

    def _abort_sample(self, sample_id: str) -> None:
        self._send(m.encode_abort(sample_id))

    def _finished(self, request_id: str, request: _Request) -> None:
        """Every sample ended: the sink gets the final result."""
        self._forget(request_id, request)
        state = request.state
        result = FinalResult(
            [SampleResult(s.index, s.text, s.token_ids, s.finish_reason, s.stop_reason,
                          s.logprobs, s.pooled) for s in state.samples],
            len(state.prompt_ids), state.prompt_logprobs)
        self._notify("finished", request, result=result)
        request.sink.final(result)

    def _forget(self, request_id: str, request: _Request) -> None:
        del self.requests[request_id]
        self.outputs.untrack(request.sample_ids)
        if request.deadline is not None:
            request.deadline.cancel()

    def _fail(self, request_id: str, code: str, message: str) -> None:
        request = self.requests.get(request_id)
        if request is not None:
            self._forget(request_id, request)
            self._notify("failed", request, code=code)
            request.sink.error(code, message)

    def _expire(self, request_id: str, deadline_s: float) -> None:
        if request_id in self.requests:
            self._send(m.encode_abort(request_id))   # the scheduler frees its blocks
            self._fail(request_id, RefusalCode.TIMEOUT, f"the request did not finish within its "
                       f"deadline of {deadline_s:g} s; it was aborted")

    def _fail_all(self, reason: str) -> None:
        for request_id in list(self.requests):
            self._fail(request_id, RefusalCode.ENGINE_DEAD, reason)

    def _notify(self, event: str, request: _Request, **details: Any) -> None:
        for observer in self.observers:
            observer(event, request, **details)

    # ---- liveness -----------------------------------------------------------------------

    async def _watch_scheduler(self) -> None:
        last_turn = time.monotonic()
        judge_after = 0.0
        while True:
            event = await next_monitor_event(self.monitor, 0.2)
            if event is not None:
                self.relink.on_event(event)
                if event & DOWN_EVENTS:
                    self.link_down_at = time.monotonic()
                    # What the scheduler sent on that connection may be lost with it: the
                    # requests wait for the link to come back and resume (link_resume.py),
                    # or, with too many to name, end now, once, with an error.
                    if self.resume.on_down(self.link_down_at, len(self.requests)):
                        # The heartbeat, on its own link, has one timeout to show fresh life.
                        judge_after = self.link_down_at + SCHEDULER_TIMEOUT_S
                        log.warning("the link to the scheduler dropped with %d request(s) "
                                    "in flight: they resume when it comes back",
                                    len(self.requests))
                    else:
                        self._fail_all("the connection to the scheduler was lost; the "
                                       "request was aborted, retry it")
                elif event & UP_EVENTS:
                    self._send(self.resume.hello(self.frontend_id, list(self.requests)))
            if self.relink.check():
                log.warning("the link to the scheduler stayed down: connecting afresh")
            now = time.monotonic()
            if now - last_turn > STALL_S:
                # This process was stopped or starved (a lost connection may be its doing):
                # give the link one timeout to show fresh life, or the scheduler's drop
                # notice naming exactly the requests it gave up.
                judge_after = now + SCHEDULER_TIMEOUT_S
            last_turn = now
            if self.requests and now >= judge_after and not self.scheduler_alive:
                self._fail_all("the scheduler is not responding")
            if self.resume.expired(now):
                self._fail_all(f"the connection to the scheduler was lost and did not come "
                               f"back within {RESUME_WAIT_S:g} s; the request was aborted, "
                               "retry it")

    def _send(self, payload: bytes) -> bool:
        """Send to the scheduler now; False (and a log line at most every few seconds, not
        one per message) when its queue is full or the link is down."""
        error = send_now(self.sock, [payload])
        if error is None:
            return True
        self.unsent += 1
        now = time.monotonic()
        if now - self.unsent_logged_at >= UNSENT_LOG_S:
            log.warning("could not reach the scheduler: %s (%d message(s) not sent since the "
                        "last report)", error, self.unsent)
            self.unsent, self.unsent_logged_at = 0, now
        return False


class _ClientEvents(OutputEvents[_Request]):
    """The output loop's news, for an engine client: timing for the metrics, each step to
    the request's sink, an error or the end of every sample to the client."""

    __slots__ = ("client",)

    def __init__(self, client: EngineClient) -> None:
        self.client = client

    def error(self, request_id: str, request: _Request, message: str,
              code: str | None = None) -> bool:
        self.client._fail(request_id, code or RefusalCode.ENGINE_DEAD, message)
        return True

    def tokens(self, request: _Request, count: int, queued_s: float | None) -> None:
        if queued_s is not None:
            self.client._notify("queued", request, seconds=queued_s)
        if count:
            now = time.monotonic()
            if request.first_token is None:
                request.first_token = now
                self.client._notify("first_token", request)
            elif self.client.observers:
                self.client._notify("tokens", request, gap=now - request.last_token,
                                    count=count)
            request.last_token = now

    def step(self, request: _Request, sample: SampleState, delta: str,
             new_ids: list[int]) -> None:
        if delta or new_ids:
            request.sink.delta(sample.index, delta, new_ids, sample.new_logprobs)

    def finished(self, request_id: str, request: _Request) -> None:
        self.client._finished(request_id, request)
