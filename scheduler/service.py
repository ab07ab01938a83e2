"""The scheduler process: owns the Scheduler, talks to frontends and to the executor.

Sockets (both bound here):
- frontend socket, ROUTER: frontends connect with DEALER; requests in, per-step outputs
  routed back to the frontend that owns each request.
- executor socket, ROUTER: the executor connects with DEALER, says hello with its capacity,
  then receives one plan per step and answers with one result; a heartbeat thread on the
  executor side proves it is alive even while it computes.

One thread, one poll loop. The scheduler never touches torch.
"""

from __future__ import annotations

import logging
import os
import signal
import time
from collections import deque
from dataclasses import MISSING, dataclass

import zmq

from scheduler.scheduler import Scheduler
from shared import messages as m
from shared.config import (CURVE_KEYS_HELP, SHUTDOWN_HELP, SHUTDOWN_TIMEOUT_S,
                           ExecutorCapacity, SchedulerConfig, SchedulingPolicy, SettingError,
                           setting)
from shared.outputs import EngineOutput, FinishReason, StepOutputs
from shared.security import (EXECUTOR, FRONTEND, load_keys, make_server, start_authenticator,
                             stop_authenticator)
from shared.step import StepPlan
from shared.transport import (DOWN_EVENTS, INSECURE_HELP, check_bind_address, configure,
                              read_monitor_event)
from shared.wire import ProtocolError

log = logging.getLogger("folio.scheduler")

FRONTEND_TYPES = frozenset({"frontend_hello", "add", "abort", "stats_request", "heartbeat",
                            "kv_map_request"})
EXECUTOR_TYPES = frozenset({"executor_hello", "result", "executor_error", "heartbeat"})
FRONTEND_HEARTBEAT_S = 0.5
PROBE_WINDOW_S = 0.5   # after a disconnect on the executor socket, probe the executor this long
FRONTEND_TIMEOUT_S = 10.0
MAX_DROP_NOTICES = 64   # frontends whose drop notice waits for their next hello
MAX_RETIRED = 4096      # routing ids of dropped frontends, never served again
FRONTEND_PROBE_S = 0.02   # after a disconnect, look for gone frontends this often
STATS_MAX_AGE_S = 0.1   # stats answers within this long of each other share one computation
KV_MAP_MAX_AGE_S = 0.25   # the same for page maps (a walk of every block table)


@dataclass(frozen=True)
class SchedulerServiceConfig(SchedulingPolicy):
    """The scheduling policy (shared with EngineConfig) plus this process's own settings;
    `folio scheduler`'s flags are generated from these fields."""

    frontend_address: str = setting(MISSING, "where frontends connect (this process binds it)")
    executor_address: str = setting(MISSING, "where the executor connects (this process "
                                    "binds it)")
    max_queued_requests: int | None = setting(
        None, "refuse new requests (queue full) past this many waiting (default: no limit)")
    max_queued_tokens: int | None = setting(
        None, "... or past this many prompt tokens waiting (default: no limit)")
    executor_timeout_s: float = setting(
        2.0, "seconds without an executor heartbeat before it is dead", "executor-timeout")
    step_timeout_s: float = setting(
        60.0, "seconds a step may take before the executor is declared hung", "step-timeout")
    shutdown_timeout_s: float = setting(
        SHUTDOWN_TIMEOUT_S, SHUTDOWN_HELP, "shutdown-timeout")
    curve_keys: str | None = setting(None, CURVE_KEYS_HELP)
    insecure_transport: bool = setting(False, INSECURE_HELP)
    async_scheduling: bool = setting(
        True, "keep one step in flight: send the plan of step N+1 before the result of "
        "step N arrives, hiding the hop")

    def __post_init__(self) -> None:
        super().__post_init__()
        for name in ("frontend_address", "executor_address"):
            if not getattr(self, name):
                raise SettingError(name, "must be an address, e.g. ipc:///run/folio/x.sock")
        for name in ("max_queued_requests", "max_queued_tokens"):
            value = getattr(self, name)
            if value is not None and (isinstance(value, bool) or value < 1):
                raise SettingError(name, f"must be a positive integer, got {value!r}")
        for name in ("executor_timeout_s", "step_timeout_s"):
            if not getattr(self, name) > 0:
                raise SettingError(name, f"must be > 0 seconds, got {getattr(self, name)}")
        if not self.shutdown_timeout_s >= 0:
            raise SettingError("shutdown_timeout_s",
                               f"must be >= 0 seconds, got {self.shutdown_timeout_s}")


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
        self.frontend_probe_until = 0.0
        self.frontend_sock.bind(check_bind_address(config.frontend_address))
        self.executor_sock = make_server(configure(self.ctx.socket(zmq.ROUTER)), keys, EXECUTOR)
        self.executor_sock.setsockopt(zmq.ROUTER_MANDATORY, 1)
        # A peer reconnecting with its old identity (after SIGSTOP/SIGCONT) takes over the
        # stale pipe instead of being ignored.
        self.executor_sock.setsockopt(zmq.ROUTER_HANDOVER, 1)
        self.executor_monitor = self.executor_sock.get_monitor_socket(DOWN_EVENTS)
        self.probe_until = 0.0   # probe the executor until then (a peer disconnected)
        self.executor_sock.bind(check_bind_address(config.executor_address))
        self.scheduler: Scheduler | None = None
        self.capacity: ExecutorCapacity | None = None
        self.executor_id: bytes | None = None
        self.executor_pid = 0
        self.executor_seen = 0.0
        # Plans whose results are due, oldest first: at most one, or two with async
        # scheduling (the executor runs the first while the second waits in its socket).
        self.inflight: deque[StepPlan] = deque()
        self.inflight_since = 0.0    # when the oldest became the step the executor is on
        self.ahead_tried = False     # a plan ahead found nothing to do: wait for a result
        self.last_sent_step = -1
        self.stale_through = -1      # errors for steps up to this one were already handled
        # request id -> (frontend identity, samples still running)
        self.owners: dict[str, tuple[bytes, int]] = {}
        self.frontends: dict[bytes, float] = {}     # frontend routing id -> last message time
        self.frontend_names: dict[bytes, str] = {}  # routing id -> the name its hello gave
        self.retired: dict[bytes, None] = {}        # routing ids given up on (oldest first)
        # frontend name -> frontend_dropped messages it could not be sent yet
        self.drop_notices: dict[str, list[bytes]] = {}
        self.heartbeat_reply = m.encode_heartbeat(os.getpid())
        self.stats_reply: tuple[float, Scheduler | None, bytes] | None = None
        self.kv_map_reply: tuple[float, Scheduler | None, bytes] | None = None
        self.last_broadcast = 0.0
        self.stopping = False
        self.draining_since: float | None = None   # first SIGTERM: refuse adds, let runs end

    # ---- main loop ----------------------------------------------------------------------

    def run(self) -> None:
        signal.signal(signal.SIGTERM, self._on_signal)
        signal.signal(signal.SIGINT, self._on_signal)
        poller = zmq.Poller()
        poller.register(self.frontend_sock, zmq.POLLIN)
        poller.register(self.executor_sock, zmq.POLLIN)
        poller.register(self.executor_monitor, zmq.POLLIN)
        poller.register(self.frontend_monitor, zmq.POLLIN)
        log.info("scheduler listening: frontends at %s, executor at %s",
                 self.config.frontend_address, self.config.executor_address)
        try:
            while not self.stopping:
                events = dict(poller.poll(timeout=0 if self._can_step() else 50))
                if self.executor_monitor in events:
                    self._on_executor_socket_event()
                if self.frontend_monitor in events:
                    read_monitor_event(self.frontend_monitor)   # some peer left: look who
                    self.frontend_probe_until = time.monotonic() + PROBE_WINDOW_S
                if self.executor_sock in events:
                    self._drain(self.executor_sock, self._on_executor_message)
                if self.frontend_sock in events:
                    self._drain(self.frontend_sock, self._on_frontend_message)
                self._check_executor()
                self._maybe_step()
                self._heartbeat_frontends()
                self._check_drain()
        finally:
            self.close()

    def close(self) -> None:
        self.executor_monitor.close(0)
        self.frontend_monitor.close(0)
        # After a drain, give the last outputs (failures included) a moment to leave.
        self.frontend_sock.close(500 if self.draining_since is not None else 0)
        self.executor_sock.close(0)
        stop_authenticator(self.auth)
        self.ctx.term()

    def _on_signal(self, *_: object) -> None:
        """First SIGTERM/SIGINT drains (no new requests; running ones may finish within
        shutdown_timeout_s); a second one stops at once."""
        if self.draining_since is None:
            log.info("draining: refusing new requests, %d running may finish within %.0f s",
                     len(self.owners), self.config.shutdown_timeout_s)
            self.draining_since = time.monotonic()
        else:
            self.stopping = True

    def _check_drain(self) -> None:
        if self.draining_since is None:
            return
        if self.owners and (time.monotonic() - self.draining_since
                            < self.config.shutdown_timeout_s):
            return
        if self.owners:
            log.warning("shutdown timeout: failing %d request(s)", len(self.owners))
            self._fail_all("the scheduler is shutting down")
        self.stopping = True

    def _drain(self, sock: zmq.Socket, handler) -> None:
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
                    self._send_frontend(frames[0], m.encode_rejected(request_id, str(error),
                                                                     "invalid"))

    # ---- frontends ----------------------------------------------------------------------

    def _on_frontend_message(self, identity: bytes, data: bytes) -> None:
        msg_type, body = m.decode(data, FRONTEND_TYPES)
        frontend = body.str("frontend", optional=True) if msg_type == "heartbeat" else None
        if frontend is not None:
            self._on_frontend_heartbeat(identity, frontend)
            return
        if identity in self.retired:   # given up on: a peer naming a gone frontend's id
            return
        if msg_type not in ("stats_request", "kv_map_request") or identity in self.frontends:
            # A health probe asking for stats is answered but not counted as a frontend.
            self.frontends[identity] = time.monotonic()
        if msg_type == "add":
            self._add(identity, *m.decode_add(body))
        elif msg_type == "abort":
            request_id = body.str("id")   # a request id, or one sample of it: "id#i"
            owner = self.owners.get(request_id.split("#", 1)[0])
            if owner is not None and owner[0] == identity and self.scheduler is not None:
                self.scheduler.abort_request(request_id)
        elif msg_type == "frontend_hello":
            name = body.str("id")
            self.frontend_names[identity] = name
            self._send_frontend(identity, self._engine_info())
            for notice in self.drop_notices.pop(name, []):
                self._send_frontend(identity, notice)
        elif msg_type == "stats_request":
            self._send_frontend(identity, self._stats_reply())
        elif msg_type == "kv_map_request":
            self._send_frontend(identity, self._kv_map_reply())

    def _stats_reply(self) -> bytes:
        """A flood of stats requests (health checks, scrapes) costs one stats() walk per
        STATS_MAX_AGE_S, not one per request; a new or lost executor is seen at once."""
        now = time.monotonic()
        cached = self.stats_reply
        if cached is None or now - cached[0] > STATS_MAX_AGE_S or cached[1] is not self.scheduler:
            cached = self.stats_reply = (now, self.scheduler, m.encode_stats(self.stats()))
        return cached[2]

    def _kv_map_reply(self) -> bytes:
        """Like _stats_reply: one page-map walk per KV_MAP_MAX_AGE_S however many ask."""
        now = time.monotonic()
        cached = self.kv_map_reply
        if (cached is None or now - cached[0] > KV_MAP_MAX_AGE_S
                or cached[1] is not self.scheduler):
            snapshot = self.scheduler.kv_map() if self.scheduler is not None else None
            cached = self.kv_map_reply = (now, self.scheduler, m.encode_kv_map(snapshot))
        return cached[2]

    def _add(self, identity: bytes, request_id: str, prompt: list[int], params) -> None:
        if self.draining_since is not None:
            self._send_frontend(identity, m.encode_rejected(
                request_id, "the scheduler is shutting down", "shutting_down"))
            return
        if self.scheduler is None:
            self._send_frontend(identity, m.encode_rejected(
                request_id, "the executor is not running; try again shortly", "engine_dead"))
            return
        if request_id in self.owners or "#" in request_id:
            self._send_frontend(identity, m.encode_rejected(
                request_id, f"request id {request_id!r} is in use or contains '#'"))
            return
        refusal = self._queue_refusal(len(prompt))
        if refusal is not None:
            self._send_frontend(identity, m.encode_rejected(request_id, *refusal))
            return
        try:   # what can never fit is refused by the scheduler, as in the offline LLM
            sample_ids = self.scheduler.add_request(request_id, prompt, params)
        except ValueError as error:
            self._send_frontend(identity, m.encode_rejected(request_id, str(error), "invalid"))
            return
        self.owners[request_id] = (identity, len(sample_ids))
        self.ahead_tried = False   # new work for the plan ahead

    def _queue_refusal(self, prompt_len: int) -> tuple[str, str] | None:
        """Why a served request is refused before it is queued: the queue is full (by
        requests or by prompt tokens). None: accept it."""
        scheduler = self.scheduler
        limit = self.config.max_queued_requests
        if limit is not None and len(scheduler.waiting) >= limit:
            return (f"the queue is full ({limit} requests waiting); retry later", "queue_full")
        token_limit = self.config.max_queued_tokens
        if token_limit is not None:
            queued = sum(r.num_tokens for r in scheduler.waiting)
            if queued + prompt_len > token_limit:
                return (f"the queue is full ({queued} prompt tokens waiting, limit "
                        f"{token_limit}); retry later", "queue_full")
        return None

    def _route_outputs(self, outputs: StepOutputs | list[EngineOutput]) -> None:
        """Each frontend gets one columnar `outputs` message with its own requests' news."""
        columnar = isinstance(outputs, StepOutputs)
        by_frontend: dict[bytes, StepOutputs] = {}
        owners = self.owners

        def batch_of(base: str):
            owner = owners.get(base)
            if owner is None:
                return None, None
            batch = by_frontend.get(owner[0])
            if batch is None:
                batch = by_frontend[owner[0]] = StepOutputs()
            return owner, batch

        for output in outputs.entries if columnar else outputs:
            base = output.request_id.split("#", 1)[0]   # samples of n > 1 report as id#i
            owner, batch = batch_of(base)
            if batch is None:
                continue
            batch.entries.append(output)
            if output.finished:
                if owner[1] == 1:
                    del owners[base]
                else:
                    owners[base] = (owner[0], owner[1] - 1)
        for request_id, token_id in zip(outputs.ids, outputs.tokens) if columnar else ():
            batch = batch_of(request_id.split("#", 1)[0])[1]
            if batch is not None:
                batch.ids.append(request_id)
                batch.tokens.append(token_id)
        for identity, batch in by_frontend.items():
            self._send_frontend(identity, m.encode_outputs(batch))

    def _on_frontend_heartbeat(self, sender: bytes, frontend: str) -> None:
        """From a frontend's heartbeat thread (its own socket): the frontend that said hello
        under this name is alive, however busy its event loop; the reply tells it that we
        are. (It only keeps a connection registered: outputs go by routing id.)"""
        now = time.monotonic()
        for identity, name in self.frontend_names.items():
            if name == frontend and identity in self.frontends:
                self.frontends[identity] = now
        try:
            self.frontend_sock.send_multipart([sender, self.heartbeat_reply], zmq.NOBLOCK)
        except zmq.ZMQError:
            pass   # that socket is gone; its frontend's own link decides

    def _send_frontend(self, identity: bytes, payload: bytes) -> None:
        try:
            self.frontend_sock.send_multipart([identity, payload], zmq.NOBLOCK)
        except zmq.ZMQError as error:
            gone = error.errno == zmq.EHOSTUNREACH
            self._drop_frontend(identity, "its connection closed" if gone else
                                "a message to it could not be delivered: its queue is full",
                                gone)

    def _retire(self, identity: bytes) -> None:
        """A connection that is gone: its routing id is never served again (a peer that
        names it later cannot pick up what was meant for the frontend that had it)."""
        self.frontend_names.pop(identity, None)
        self.retired[identity] = None
        if len(self.retired) > MAX_RETIRED:
            del self.retired[next(iter(self.retired))]

    def _drop_frontend(self, identity: bytes, reason: str, gone: bool = False) -> None:
        """Give up on a frontend connection: abort its requests so their blocks come back,
        and tell the frontend which (on this connection, on its newer one, or at its next
        hello when it cannot be reached now)."""
        self.frontends.pop(identity, None)
        name = self.frontend_names.get(identity)
        if gone:
            self._retire(identity)
        orphans = [rid for rid, owner in self.owners.items() if owner[0] == identity]
        for request_id in orphans:
            del self.owners[request_id]
            if self.scheduler is not None:
                self.scheduler.abort_request(request_id)
        if not orphans:
            return
        log.warning("gave up on frontend %r (%s): aborted its %d request(s)", identity, reason,
                    len(orphans))
        notices = m.encode_frontend_dropped(orphans, reason)
        targets = [] if gone else [identity]
        targets += [other for other, other_name in self.frontend_names.items()
                    if other_name == name and other != identity and other in self.frontends]
        for target in targets:
            try:
                for notice in notices:
                    self.frontend_sock.send_multipart([target, notice], zmq.NOBLOCK)
                return
            except zmq.ZMQError:
                continue
        if name is None:
            return   # it never said hello: nobody to tell
        if len(self.drop_notices) >= MAX_DROP_NOTICES and name not in self.drop_notices:
            del self.drop_notices[next(iter(self.drop_notices))]   # the oldest
        self.drop_notices.setdefault(name, []).extend(notices)

    def _heartbeat_frontends(self) -> None:
        """engine_info to every frontend each FRONTEND_HEARTBEAT_S, and more often for a
        moment after a peer of the socket disconnected: a send to a connection that is gone
        fails at once (ROUTER_MANDATORY), so a dead frontend is given up in milliseconds."""
        now = time.monotonic()
        probing = now < self.frontend_probe_until
        if now - self.last_broadcast < (FRONTEND_PROBE_S if probing else FRONTEND_HEARTBEAT_S):
            return
        if probing:   # process pending pipe terminations first (as _probe_executor does)
            self.frontend_sock.getsockopt(zmq.EVENTS)
        self.last_broadcast = now
        info = self._engine_info()
        for identity, seen in list(self.frontends.items()):
            if now - seen > FRONTEND_TIMEOUT_S:
                self._drop_frontend(identity, f"no heartbeat from it for "
                                    f"{FRONTEND_TIMEOUT_S:.0f} s")
            else:
                self._send_frontend(identity, info)

    def _engine_info(self) -> bytes:
        cap = self.capacity
        return m.EngineInfo(
            max_model_len=cap.max_model_len if cap else 1, vocab_size=cap.vocab_size if cap else 1,
            num_kv_blocks=cap.num_kv_blocks if cap else 1, block_size=cap.block_size if cap else 1,
            eos_token_ids=cap.eos_token_ids if cap else (),
            executor_alive=self.scheduler is not None,
            max_logprobs=self.config.max_logprobs, max_n=self.config.max_n).encode()

    # ---- executor -----------------------------------------------------------------------

    def _on_executor_message(self, identity: bytes, data: bytes) -> None:
        msg_type, body = m.decode(data, EXECUTOR_TYPES)
        if msg_type == "heartbeat":
            if body.int("pid", 0) == self.executor_pid:
                self.executor_seen = time.monotonic()
        elif msg_type == "executor_hello":
            self._on_executor_hello(identity, *m.decode_hello_executor(body))
        elif identity != self.executor_id:
            log.warning("dropped %s from an unknown executor", msg_type)
        elif msg_type == "result":
            self._on_result(m.decode_result(body))
        elif msg_type == "executor_error":
            if body.int("s", 0) <= self.stale_through:
                log.warning("dropped an error for step %d, sent before an earlier failure",
                            body.int("s", 0))
                return
            if self.scheduler is not None:
                self.scheduler.discard_unconfirmed()   # that step's blocks hold garbage
            self._fail_all(f"the executor failed a step: {body.str('message', 2000)}")

    def _on_executor_hello(self, identity: bytes, capacity: ExecutorCapacity, pid: int) -> None:
        alive = time.monotonic() - self.executor_seen < self.config.executor_timeout_s
        if (self.scheduler is not None and self.executor_id is not None
                and identity != self.executor_id and alive):
            log.warning("ignored a hello from %r: executor %d is attached and alive",
                        identity, self.executor_pid)
            return
        try:   # validated before start; a hello from elsewhere may still not fit
            config = SchedulerConfig.from_engine(self.config, capacity)
        except ValueError as error:
            log.error("refused executor %d: its capacity makes an invalid configuration: %s",
                      pid, error)
            if identity == self.executor_id:   # the attached one reset: it is gone too
                self._fail_all("the executor restarted with an invalid configuration")
                self.scheduler = self.executor_id = None
                self._broadcast_info()
            return
        if self.scheduler is not None:
            self._fail_all("the executor restarted")
        self.executor_id, self.executor_pid = identity, pid
        self.executor_seen = time.monotonic()
        self.capacity = capacity
        self.last_sent_step = self.stale_through = -1   # a new scheduler counts from 0
        self.scheduler = Scheduler(config)
        log.info("executor %d attached: %d KV blocks of %d tokens, max_model_len %d", pid,
                 capacity.num_kv_blocks, capacity.block_size, capacity.max_model_len)
        pool = capacity.num_kv_blocks * capacity.block_size
        if pool < capacity.max_model_len:   # e.g. --num-kv-blocks 1: said, not silent
            log.warning("the KV pool holds %d tokens, fewer than max_model_len %d: requests "
                        "whose prompt plus max_tokens exceed %d tokens will be refused", pool,
                        capacity.max_model_len, pool)
        self._broadcast_info()

    def _on_result(self, result) -> None:
        inflight = self.inflight
        if not inflight or result.step_id != inflight[0].step_id or self.scheduler is None:
            log.warning("dropped a result for step %d that is not in flight", result.step_id)
            return
        plan = inflight.popleft()
        self.ahead_tried = False
        self.inflight_since = time.monotonic()
        self._route_outputs(self.scheduler.update(plan, result))

    def _on_executor_socket_event(self) -> None:
        """Some peer of the executor socket disconnected. Any peer may connect there, so
        ask the ROUTER, for a short while, whether the executor itself is still reachable:
        sending to a vanished identity fails at once (ROUTER_MANDATORY). A killed executor
        is noticed in milliseconds instead of after the heartbeat timeout."""
        if read_monitor_event(self.executor_monitor) & DOWN_EVENTS:
            self.probe_until = time.monotonic() + PROBE_WINDOW_S

    def _probe_executor(self) -> None:
        if self.executor_id is None or time.monotonic() > self.probe_until:
            return
        # Reading EVENTS makes the socket process pending pipe terminations first;
        # a plain send may skip that for a while (libzmq throttles command processing).
        self.executor_sock.getsockopt(zmq.EVENTS)
        try:
            self.executor_sock.send_multipart([self.executor_id, m.pack("ping", {})],
                                              zmq.NOBLOCK)
        except zmq.ZMQError:
            self._executor_lost("the executor's connection closed")

    def _check_executor(self) -> None:
        if self.scheduler is None:
            return
        self._probe_executor()
        now = time.monotonic()
        if now - self.executor_seen > self.config.executor_timeout_s:
            self._executor_lost(f"the executor stopped responding (no heartbeat for "
                                f"{self.config.executor_timeout_s:.1f} s)")
        elif self.inflight and now - self.inflight_since > self.config.step_timeout_s:
            self._executor_lost(f"the executor did not finish a step within "
                                f"{self.config.step_timeout_s:.0f} s")

    def _executor_lost(self, reason: str) -> None:
        log.error("%s; failing in-flight requests and waiting for a new executor", reason)
        self._fail_all(reason)
        if self.executor_id is not None:
            # A hung (not dead) executor gets this once it is free again: it drops its
            # state and says hello, and service resumes.
            try:
                self.executor_sock.send_multipart([self.executor_id, m.pack("reset", {})],
                                                  zmq.NOBLOCK)
            except zmq.ZMQError:
                pass
        self.scheduler = None
        self.executor_id = None
        self.executor_pid = -1
        self._broadcast_info()

    def _fail_all(self, reason: str) -> None:
        self.inflight.clear()
        self.stale_through = self.last_sent_step
        if self.scheduler is None:
            return
        failed = []
        for request_id in list(self.scheduler.requests):
            self.scheduler.abort_request(request_id)
            failed.append(EngineOutput(request_id, [], FinishReason.ERROR, reason))
        self.scheduler.take_pending_outputs()
        self._route_outputs(failed)

    def _broadcast_info(self) -> None:
        info = self._engine_info()
        for identity in list(self.frontends):
            self._send_frontend(identity, info)

    # ---- stepping -----------------------------------------------------------------------

    def _can_step(self) -> bool:
        if self.scheduler is None or not self.scheduler.has_work():
            return False
        if not self.inflight:
            return True
        # One step ahead: plan N+1 while step N runs; the executor feeds its own samples in.
        return self.config.async_scheduling and len(self.inflight) == 1 and not self.ahead_tried

    def _maybe_step(self) -> None:
        for _ in range(2):   # with nothing in flight, the step and the one ahead of it
            if not self._can_step():
                return
            self._step()

    def _step(self) -> None:
        scheduler = self.scheduler
        ahead = bool(self.inflight)
        plan = scheduler.schedule()
        pending = scheduler.take_pending_outputs()
        if pending:
            self._route_outputs(pending)
        if plan.is_empty and not plan.finished_handles:
            self.ahead_tried = ahead
            return
        try:
            self.executor_sock.send_multipart([self.executor_id, m.encode_plan(plan)],
                                              zmq.NOBLOCK)
        except zmq.ZMQError:
            self._executor_lost("the executor's connection is gone")
            return
        self.last_sent_step = plan.step_id
        if plan.is_empty:
            self.ahead_tried = ahead
            return   # only forget notices: no result will come back
        if not self.inflight:
            self.inflight_since = time.monotonic()
        self.inflight.append(plan)

    def stats(self) -> dict:
        stats = dict(self.scheduler.stats()) if self.scheduler else {}
        stats["executor_alive"] = self.scheduler is not None
        stats["num_frontends"] = len(self.frontends)
        return stats
