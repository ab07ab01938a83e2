"""The scheduler process: owns the Scheduler and the two sockets, reads them, and steps.

Sockets (both bound here):
- frontend socket, ROUTER: frontends connect with DEALER; requests in, per-step outputs
  routed back to the frontend that owns each request (frontend_router.py).
- executor socket, ROUTER: the executor connects with DEALER, says hello with its capacity,
  then receives one plan per step and answers with one result; a heartbeat thread on the
  executor side proves it is alive even while it computes (executor_link.py).

The parts: queue limits (admission.py), the steps in flight (steps_in_flight.py, one step
ahead; what a step is: Scheduler.plan_for_executor), the graceful stop (shutdown.py),
shared stats and page-map answers (reply_cache.py). This module wires them: one thread, one
poll loop.
The scheduler never touches torch.
"""

from __future__ import annotations

import logging
import os
import secrets
import signal
import time
from collections.abc import Callable

import zmq

from folio.scheduler.admission import QueueLimits, queue_refusal
from folio.scheduler.decode_rate import DecodeRate
from folio.scheduler.executor_link import ExecutorLink, ExecutorTimeouts
from folio.scheduler.frontend_router import FrontendRouter
from folio.scheduler.kv_event_publisher import KVEventPublisher
from folio.scheduler.kv_events import KVEventLog
from folio.scheduler.reply_cache import CachedReply
from folio.scheduler.request_failure import fail_requests
from folio.scheduler.scheduler import Scheduler
from folio.scheduler.service_config import SchedulerServiceConfig
from folio.scheduler.shutdown import ShutdownDrain
from folio.scheduler.spec_decode import SpecLog
from folio.scheduler.steps_in_flight import StepsInFlight
from folio.shared.protocol import messages as m
from folio.shared.protocol.codes import RefusalCode
from folio.shared.config import ExecutorCapacity, SchedulerConfig
from folio.shared.kv_events_config import parse_kv_events_config
from folio.shared.security import (EXECUTOR, FRONTEND, load_keys, make_server,
                                   start_authenticator, stop_authenticator)
from folio.shared.transport import (DOWN_EVENTS, check_bind_address, configure,
                                    read_monitor_event)
from folio.shared.protocol.wire import ProtocolError

log = logging.getLogger("folio.scheduler")

REREGISTER_PREFIX = "reregister:"   # update ids of loads this process asks for itself
HEALTH_PROBES = frozenset({"stats_request", "kv_map_request"})   # answered; not a frontend
STATS_MAX_AGE_S = 0.1   # stats answers within this long of each other share one computation
# (unless a request finished between them)
KV_MAP_MAX_AGE_S = 0.25   # the same for page maps (a walk of every block table)


class SchedulerService:
    def __init__(self, config: SchedulerServiceConfig) -> None:
        self.config = config
        self.ctx = zmq.Context()
        keys = load_keys(config.curve_keys, server=True, client=False,
                         serves=(FRONTEND, EXECUTOR)) if config.curve_keys else None
        # Each socket admits its own peers' keys only (an SDK user's key opens neither).
        self.auth = start_authenticator(self.ctx, keys, (FRONTEND, EXECUTOR))   # before binds
        self.frontend_sock = make_server(configure(self.ctx.socket(zmq.ROUTER)), keys, FRONTEND)
        self.frontend_sock.setsockopt(zmq.ROUTER_MANDATORY, 1)
        # No ROUTER_HANDOVER: frontends set no identity, this ROUTER assigns each connection
        # its own routing id, and a peer naming one already in use is refused, so nobody
        # takes over a frontend's outputs. A frontend that reconnects is a new peer.
        self.frontend_monitor = self.frontend_sock.get_monitor_socket(DOWN_EVENTS)
        self.frontend_sock.bind(check_bind_address(config.frontend_address))
        self.executor_sock = make_server(configure(self.ctx.socket(zmq.ROUTER)), keys, EXECUTOR)
        self.executor_sock.setsockopt(zmq.ROUTER_MANDATORY, 1)
        # A peer reconnecting with its old identity (after SIGSTOP/SIGCONT) takes over the
        # stale pipe instead of being ignored.
        self.executor_sock.setsockopt(zmq.ROUTER_HANDOVER, 1)
        self.executor_monitor = self.executor_sock.get_monitor_socket(DOWN_EVENTS)
        self.executor_sock.bind(check_bind_address(config.executor_address))
        self.poller = zmq.Poller()
        for sock in (self.frontend_sock, self.executor_sock, self.executor_monitor,
                     self.frontend_monitor):
            self.poller.register(sock, zmq.POLLIN)
        events = parse_kv_events_config(config.kv_events_config) \
            if config.kv_events_config else None
        self.kv_events = KVEventPublisher(self.ctx, events) \
            if events is not None and events.publishes else None
        self.scheduler: Scheduler | None = None   # one per attached executor
        self.decode_rate = DecodeRate(0)            # likewise
        self.spec_log = SpecLog()
        self.router = FrontendRouter(self.frontend_sock, self._abort_orphan)
        self.epoch = secrets.token_hex(8)   # this run: frontends see a restart by it
        self.executor_link = ExecutorLink(self.executor_sock, ExecutorTimeouts(
            heartbeat_s=config.executor_timeout_s, step_s=config.step_timeout_s))
        self.steps = StepsInFlight(one_ahead=config.async_scheduling)
        self.queue_limits = QueueLimits(config.max_queued_requests, config.max_queued_tokens)
        self.shutdown = ShutdownDrain(config.shutdown_timeout_s)
        self.heartbeat_reply = m.encode_heartbeat(os.getpid())
        self.stats_reply = CachedReply(STATS_MAX_AGE_S)
        self.kv_map_reply = CachedReply(KV_MAP_MAX_AGE_S)
        # LoRA loads and unloads passed to the executor: update id -> (asker, is a load).
        self.lora_updates: dict[str, tuple[bytes, bool]] = {}
        # The adapter registry's runtime half (this process owns it): adapters loaded while
        # serving, name -> path, given again to an executor that restarts (the ones from
        # --lora-modules it loads itself).
        self.runtime_loras: dict[str, str] = {}
        self.lora_path_pending: dict[str, str] = {}   # update id -> path of a load asked

    # ---- main loop ----------------------------------------------------------------------

    def run(self) -> None:
        signal.signal(signal.SIGTERM, self._on_signal)
        signal.signal(signal.SIGINT, self._on_signal)
        log.info("scheduler listening: frontends at %s, executor at %s",
                 self.config.frontend_address, self.config.executor_address)
        try:
            while not self.shutdown.stopping:
                self._turn()
        finally:
            self.close()

    def _turn(self) -> None:
        """One turn of the loop: read what arrived, check the executor, step, heartbeat."""
        events = dict(self.poller.poll(timeout=0 if self._can_step() else 50))
        if self.executor_monitor in events:
            if read_monitor_event(self.executor_monitor) & DOWN_EVENTS:
                self.executor_link.on_peer_disconnected()
        if self.frontend_monitor in events:
            read_monitor_event(self.frontend_monitor)   # some peer left: look who
            self.router.on_peer_disconnected()
        if self.executor_sock in events:
            self._read_burst(self.executor_sock, self._on_executor_message)
        if self.frontend_sock in events:
            self._read_burst(self.frontend_sock, self._on_frontend_message)
        self._check_executor()
        self._maybe_step()
        if self.kv_events is not None:
            self._publish_kv_events()
        if self.scheduler is not None and self.scheduler.drafts is not None:
            line = self.spec_log.line(time.monotonic(), self.scheduler.drafts.counters)
            if line is not None:
                log.info("%s", line)
        self.router.heartbeat(self._engine_info)
        self._check_drain()

    def _publish_kv_events(self) -> None:
        """This turn's prefix-cache changes, one batch (registrations happen as steps are
        planned, removals as blocks are evicted or a failed step takes them back). Replays
        are answered on the publisher's own thread, never here."""
        if self.scheduler is not None:
            self.kv_events.publish(self.scheduler.kv.pool.events.drain())

    def close(self) -> None:
        if self.kv_events is not None:
            self.kv_events.close()
        self.executor_monitor.close(0)
        self.frontend_monitor.close(0)
        # After a drain, give the last outputs (failures included) a moment to leave.
        self.frontend_sock.close(500 if self.shutdown.draining else 0)
        self.executor_sock.close(0)
        stop_authenticator(self.auth)
        self.ctx.term()

    def _on_signal(self, *_: object) -> None:
        self.shutdown.on_signal(self.router.num_requests)

    def _check_drain(self) -> None:
        running = self.router.num_requests
        if not self.shutdown.is_over(running):
            return
        if running:
            log.warning("shutdown timeout: failing %d request(s)", running)
            self._fail_all("the scheduler is shutting down")
        self.shutdown.stopping = True

    def _read_burst(self, sock: zmq.Socket, handler: Callable[[bytes, bytes], None]) -> None:
        """Handle the messages waiting on `sock`, up to 1000 (then let the loop turn)."""
        for _ in range(1000):
            try:
                frames = sock.recv_multipart(zmq.NOBLOCK)
            except zmq.Again:
                return
            if len(frames) != 2:
                log.warning("dropped a message with %d frames", len(frames))
                continue
            try:
                handler(frames[0], frames[1])
            except ProtocolError as error:
                log.warning("dropped a malformed message: %s", error)
                request_id = m.peek_id(frames[1])
                if sock is self.frontend_sock and request_id:
                    self.router.send(frames[0], m.encode_rejected(request_id, str(error),
                                                                  RefusalCode.INVALID))

    # ---- frontends ----------------------------------------------------------------------

    def _on_frontend_message(self, identity: bytes, data: bytes) -> None:
        msg_type, body = m.decode(data, m.FRONTEND_TO_SCHEDULER)
        frontend = m.decode_heartbeat(body).frontend if msg_type == "heartbeat" else None
        if frontend is not None:
            self.router.on_heartbeat(identity, frontend, self.heartbeat_reply)
            return
        if self.router.is_retired(identity):   # given up on: a peer naming a gone one's id
            return
        # A health probe asking for stats is answered but not counted as a frontend.
        self.router.heard_from(identity, registers=msg_type not in HEALTH_PROBES)
        if msg_type == "add":
            self._add(identity, *m.decode_add(body))
        elif msg_type == "abort":
            request_id = m.decode_abort(body).request_id   # an id, or one sample's: "id#i"
            if self.router.owns(identity, request_id) and self.scheduler is not None:
                self.scheduler.abort_request(request_id)
        elif msg_type == "frontend_hello":
            hello = m.decode_frontend_hello(body)
            self.router.on_hello(identity, hello.frontend_id, self._engine_info(),
                                 hello.resume_seq, hello.resume_ids)
        elif msg_type == "stats_request":
            self.router.send(identity, self._stats_reply())
        elif msg_type == "kv_map_request":
            self.router.send(identity, self._kv_map_reply())
        elif msg_type == "lora_update":
            self._on_lora_update(identity, m.decode_lora_update(body))

    def _on_lora_update(self, identity: bytes, update) -> None:
        """A frontend loads or unloads an adapter (docs/lora.md). An unload is refused while
        unfinished requests use the adapter; once accepted no new request may name it, so
        no plan after it does. A load counts once the executor says it is done."""
        scheduler, name = self.scheduler, update.name
        error = None
        if update.update_id.startswith(REREGISTER_PREFIX):
            error = f"update ids starting {REREGISTER_PREFIX!r} are this process's own"
        elif scheduler is None:
            error = "the executor is not running; try again shortly"
        elif update.path is None and name not in scheduler.loras:
            error = f"no LoRA adapter named {name!r} is loaded"
        elif update.path is None and scheduler.lora_requests(name):
            error = (f"LoRA adapter {name!r} has {scheduler.lora_requests(name)} unfinished "
                     "request(s); unload it once they are done")
        elif update.path is not None and name in scheduler.loras:
            error = f"a LoRA adapter named {name!r} is already loaded"
        if error is not None:
            self.router.send(identity, m.encode_lora_updated(update.update_id, name, error))
            return
        if update.path is None:
            scheduler.forget_lora(name)
            self.runtime_loras.pop(name, None)
        else:
            self.lora_path_pending[update.update_id] = update.path
        self.lora_updates[update.update_id] = (identity, update.path is not None)
        if not self.executor_link.send(m.encode_lora_update(update.update_id, name,
                                                            update.path)):
            self.lora_updates.pop(update.update_id)
            self.router.send(identity, m.encode_lora_updated(
                update.update_id, name, "the executor's connection is gone"))

    def _stats_reply(self) -> bytes:
        # Fresh after any request finished: its counters (prefix hits, finished) show at
        # once to the client that got its answer and asks next.
        scheduler = self.scheduler
        finished = scheduler.counters["num_finished"] if scheduler is not None else 0
        return self.stats_reply.get(scheduler, lambda: m.encode_stats(self.stats()),
                                    version=finished)

    def _kv_map_reply(self) -> bytes:
        scheduler = self.scheduler
        return self.kv_map_reply.get(scheduler, lambda: m.encode_kv_map(
            scheduler.kv_map() if scheduler is not None else None))

    def _add(self, identity: bytes, request_id: str, prompt: list[int], params,
             client: str | None = None) -> None:
        refusal = self._refusal(request_id, len(prompt))
        if refusal is not None:
            self.router.send(identity, m.encode_rejected(request_id, *refusal))
            return
        try:   # what can never fit is refused by the scheduler, as in the offline LLM
            sample_ids = self.scheduler.add_request(request_id, prompt, params, client)
        except ValueError as error:
            self.router.send(identity, m.encode_rejected(request_id, str(error),
                                                         RefusalCode.INVALID))
            return
        self.router.claim(request_id, identity, len(sample_ids))
        self.steps.new_work()   # for the plan ahead

    def _refusal(self, request_id: str, prompt_len: int) -> tuple[str, str] | None:
        """(message, code) when this process refuses a request before the scheduler sees
        it; None: ask the scheduler."""
        if self.shutdown.draining:
            return ("the scheduler is shutting down", RefusalCode.SHUTTING_DOWN)
        if self.scheduler is None:
            return ("the executor is not running; try again shortly", RefusalCode.ENGINE_DEAD)
        if self.router.in_use(request_id) or "#" in request_id:
            return (f"request id {request_id!r} is in use or contains '#'",
                    RefusalCode.REJECTED)
        scheduler = self.scheduler
        free_seats = scheduler.config.max_num_seqs - len(scheduler.running)
        return queue_refusal(self.queue_limits, scheduler.waiting, prompt_len, free_seats)

    def _abort_orphan(self, request_id: str) -> None:
        """A request whose frontend was given up on: its blocks come back."""
        if self.scheduler is not None:
            self.scheduler.abort_request(request_id)

    def _engine_info(self) -> bytes:
        cap = self.executor_link.capacity
        return m.EngineInfo(
            max_model_len=cap.max_model_len if cap else 1, vocab_size=cap.vocab_size if cap else 1,
            num_kv_blocks=cap.num_kv_blocks if cap else 1, block_size=cap.block_size if cap else 1,
            eos_token_ids=cap.eos_token_ids if cap else (),
            executor_alive=self.scheduler is not None,
            max_logprobs=self.config.max_logprobs, max_n=self.config.max_n,
            executor_ranks=self.executor_link.ranks,
            loras=tuple(sorted(self.scheduler.loras)) if self.scheduler else (),
            pooling=cap.pooling if cap else None, epoch=self.epoch).encode()

    # ---- executor -----------------------------------------------------------------------

    def _on_executor_message(self, identity: bytes, data: bytes) -> None:
        msg_type, body = m.decode(data, m.EXECUTOR_TO_SCHEDULER)
        if msg_type == "heartbeat":
            self.executor_link.on_heartbeat(m.decode_heartbeat(body).pid)
        elif msg_type == "executor_hello":
            self._on_executor_hello(identity, *m.decode_hello_executor(body))
        elif identity != self.executor_link.identity:
            log.warning("dropped %s from an unknown executor", msg_type)
        elif msg_type == "result":
            self._on_result(m.decode_result(body))
        elif msg_type == "lora_updated":
            self._on_lora_updated(m.decode_lora_updated(body))
        elif msg_type == "executor_error":
            error = m.decode_executor_error(body)
            if self.steps.is_stale(error.step_id):
                log.warning("dropped an error for step %d, sent before an earlier failure",
                            error.step_id)
                return
            if self.scheduler is not None:
                self.scheduler.discard_unconfirmed()   # that step's blocks hold garbage
            self._fail_all(f"the executor failed a step: {error.message}")

    def _on_lora_updated(self, done) -> None:
        path = self.lora_path_pending.pop(done.update_id, None)
        if done.update_id.startswith(REREGISTER_PREFIX):
            self._on_reregistered(done, path)
            return
        asker = self.lora_updates.pop(done.update_id, None)
        if asker is None:
            log.warning("dropped an answer to LoRA update %r, which is not pending",
                        done.update_id)
            return
        identity, loads = asker
        if loads and done.error is None and self.scheduler is not None:
            self.scheduler.loras.add(done.name)
            if path is not None:
                self.runtime_loras[done.name] = path
        # Every frontend's list of adapters first: the asker reads it before the answer,
        # so a request it sends after the answer finds the adapter (or not) as answered.
        self.router.broadcast(self._engine_info())
        self.router.send(identity, m.encode_lora_updated(done.update_id, done.name,
                                                         done.error))

    def _on_executor_hello(self, identity: bytes, capacity: ExecutorCapacity, pid: int,
                           ranks: tuple[int, ...] = ()) -> None:
        link = self.executor_link
        if self.scheduler is not None and link.is_another_live_executor(identity):
            log.warning("ignored a hello from %r: executor %d is attached and alive",
                        identity, link.pid)
            return
        try:   # validated before start; a hello from elsewhere may still not fit
            config = SchedulerConfig.from_engine(self.config, capacity)
        except ValueError as error:
            log.error("refused executor %d: its capacity makes an invalid configuration: %s",
                      pid, error)
            if identity == link.identity:   # the attached one reset: it is gone too
                self._fail_all("the executor restarted with an invalid configuration")
                self.scheduler = None
                link.detach()
                self.router.broadcast(self._engine_info())
            return
        if self.scheduler is not None:
            self._fail_all("the executor restarted")
        link.attach(identity, pid, capacity, ranks)
        self.decode_rate = DecodeRate(capacity.weight_bytes_per_step)
        self.steps.restart()   # a new scheduler counts from 0
        self.scheduler = Scheduler(config, self._new_kv_event_log(capacity.block_size))
        log.info("executor %d attached: %d KV blocks of %d tokens%s, max_model_len %d", pid,
                 capacity.num_kv_blocks, capacity.block_size,
                 f" ({2**30 * capacity.block_size // capacity.bytes_per_block} tokens per GiB)"
                 if capacity.bytes_per_block else "", capacity.max_model_len)
        pool = capacity.num_kv_blocks * capacity.block_size
        if pool < capacity.max_model_len:   # e.g. --num-kv-blocks 1: said, not silent
            log.warning("the KV pool holds %d tokens, fewer than max_model_len %d: requests "
                        "whose prompt plus max_tokens exceed %d tokens will be refused", pool,
                        capacity.max_model_len, pool)
        self.router.broadcast(self._engine_info())
        self._reregister_loras()

    def _reregister_loras(self) -> None:
        """A new executor knows only the adapters of --lora-modules: give it the ones loaded
        while serving again; each counts (and is listed) once it says it has it."""
        for name, path in self.runtime_loras.items():
            update_id = f"{REREGISTER_PREFIX}{name}"
            self.lora_path_pending[update_id] = path
            log.info("re-registering LoRA adapter %r from %s with the new executor", name, path)
            if not self.executor_link.send(m.encode_lora_update(update_id, name, path)):
                self.lora_path_pending.pop(update_id, None)
                log.warning("could not re-register LoRA adapter %r: the executor's connection "
                            "is gone", name)

    def _on_reregistered(self, done, path: str | None) -> None:
        if done.error is not None or self.scheduler is None:
            self.runtime_loras.pop(done.name, None)
            log.warning("LoRA adapter %r could not be re-registered after the executor "
                        "restart (%s): it is no longer served", done.name, done.error)
            return
        self.scheduler.loras.add(done.name)
        log.info("LoRA adapter %r re-registered after the executor restart", done.name)
        self.router.broadcast(self._engine_info())

    def _new_kv_event_log(self, block_size: int) -> KVEventLog | None:
        """A new executor's empty cache: subscribers drop what they knew of the old one."""
        if self.kv_events is None:
            return None
        log_ = KVEventLog(block_size)
        log_.cleared()
        return log_

    def _on_result(self, result) -> None:
        plan = self.steps.take(result.step_id) if self.scheduler is not None else None
        if plan is None:
            log.warning("dropped a result for step %d that is not in flight", result.step_id)
            return
        self.decode_rate.observe(plan, result, bursts=self.scheduler.bursts)
        self.router.route(self.scheduler.update(plan, result))

    def _check_executor(self) -> None:
        if self.scheduler is None:
            return
        reason = self.executor_link.loss(self.steps.step_running_since())
        if reason is not None:
            self._executor_lost(reason)

    def _executor_lost(self, reason: str) -> None:
        log.error("%s; failing in-flight requests and waiting for a new executor", reason)
        for update_id, (identity, _) in self.lora_updates.items():
            self.router.send(identity, m.encode_lora_updated(update_id, "", reason))
        self.lora_updates.clear()
        self.lora_path_pending.clear()
        self._fail_all(reason)
        self.executor_link.lose()
        self.scheduler = None
        self.router.broadcast(self._engine_info())

    def _fail_all(self, reason: str) -> None:
        self.steps.give_up()
        if self.scheduler is not None:
            self.router.route(fail_requests(self.scheduler, self.router.request_ids(), reason))

    # ---- stepping -----------------------------------------------------------------------

    def _can_step(self) -> bool:
        return self.scheduler is not None and self.steps.can_send(self.scheduler.has_work())

    def _maybe_step(self) -> None:
        for _ in range(2):   # with nothing in flight, the step and the one ahead of it
            if not self._can_step():
                return
            self._step()

    def _step(self) -> None:
        scheduler = self.scheduler
        ahead = bool(self.steps.plans)
        plan = scheduler.plan_for_executor()
        pending = scheduler.take_pending_outputs()   # aborts: reported now, not with a result
        if pending:
            self.router.route(pending)
        if plan is not None and not self.executor_link.send(m.encode_plan(plan)):
            self._executor_lost("the executor's connection is gone")
            return
        self.steps.planned(plan, ahead)

    def stats(self) -> dict:
        stats = dict(self.scheduler.stats()) if self.scheduler else {}
        stats.update(self.decode_rate.stats())
        stats["executor_alive"] = self.scheduler is not None
        stats["executor_ranks"] = list(self.executor_link.ranks)
        stats["num_frontends"] = len(self.router.frontends)
        return stats
