"""The executor process: connects to the scheduler, reports its capacity, applies plans.

A heartbeat thread with its own socket tells the scheduler this process is alive even while
the main thread is inside a long forward pass.
"""

from __future__ import annotations

import logging
import os
import signal
import threading
import time
import traceback
import uuid
from dataclasses import dataclass

import zmq

from folio.executor.executor import Executor
from folio.shared.protocol import messages as m
from folio.shared.config import EngineConfig
from folio.shared.security import EXECUTOR, load_keys, make_peer
from folio.shared.transport import (UP_EVENTS, Relink, configure, monitor_socket,
                              read_monitor_event, send_heartbeats)
from folio.shared.protocol.wire import ProtocolError

log = logging.getLogger("folio.executor")

HEARTBEAT_S = 0.25


@dataclass(frozen=True)
class ExecutorServiceConfig:
    scheduler_address: str
    engine: EngineConfig
    curve_keys: str | None = None    # CURVE keys directory (client keypair, server public key)


class ExecutorService:
    def __init__(self, config: ExecutorServiceConfig) -> None:
        self.config = config
        self.keys = load_keys(config.curve_keys, peer=EXECUTOR) \
            if config.curve_keys else None   # fail fast
        # Tensor parallelism: this process is rank 0 and starts the others (executor/parallel/group.py).
        self.ranks = None
        if config.engine.tensor_parallel_size > 1:
            from folio.executor.parallel.group import RankGroup

            self.ranks = RankGroup(config.engine, config.curve_keys)
        try:
            self.executor = Executor(self.ranks.engine if self.ranks else config.engine,
                                     self.ranks.tp if self.ranks else None)
        except BaseException:
            if self.ranks is not None:
                self.ranks.stop()
            raise
        self.ctx = zmq.Context()
        self.sock = make_peer(configure(self.ctx.socket(zmq.DEALER)), self.keys)
        # The suffix keeps a restarted container (often the same pid) a distinct peer.
        self.sock.setsockopt(zmq.IDENTITY,
                             f"executor-{os.getpid()}-{uuid.uuid4().hex[:6]}".encode())
        self.monitor = monitor_socket(self.sock)   # before connect: see the first handshake
        self.sock.connect(config.scheduler_address)
        self.relink = Relink(self.sock, config.scheduler_address)   # after an oversize message
        self.last_step_id = 0
        self.linger_ms = 0   # a message still queued at exit is dropped, unless said otherwise
        self.stop = threading.Event()
        self.heartbeat = threading.Thread(target=self._heartbeat_loop, daemon=True)

    def run(self) -> None:
        signal.signal(signal.SIGTERM, lambda *_: self.stop.set())
        signal.signal(signal.SIGINT, lambda *_: self.stop.set())
        pid = os.getpid()
        self.heartbeat.start()
        monitor = self.monitor
        poller = zmq.Poller()
        poller.register(self.sock, zmq.POLLIN)
        poller.register(monitor, zmq.POLLIN)
        log.info("executor %d connecting to %s", pid, self.config.scheduler_address)
        try:
            while not self.stop.is_set():
                events = dict(poller.poll(100))
                if self.ranks is not None:
                    self.ranks.check()   # a dead rank: exit, and the scheduler fails steps
                event = read_monitor_event(monitor) if monitor in events else 0
                self.relink.on_event(event)
                if self.relink.check():
                    log.warning("the link to the scheduler stayed down: connecting afresh")
                if event & UP_EVENTS:
                    # A (re)connected scheduler knows nothing of us: start clean, say hello.
                    self._to_ranks(m.encode_reset())
                    self.executor.reset()
                    self.sock.send(self._hello())
                if self.sock not in events:
                    continue
                data = self.sock.recv()
                try:
                    msg_type, body = m.decode(data, m.SCHEDULER_TO_EXECUTOR)
                    plan = m.decode_plan(body) if msg_type == "plan" else None
                except ProtocolError as error:
                    log.warning("dropped a malformed message: %s", error)
                    continue
                if msg_type == "ping":
                    continue   # the scheduler checking that we are still connected
                if msg_type == "lora_update":   # between steps, as the plans come
                    self.sock.send(self._lora_update(m.decode_lora_update(body)))
                    continue
                self._to_ranks(data)   # the plan or reset, to every other rank
                if plan is None:   # reset: the scheduler gave up on our state
                    self.executor.reset()
                    self.sock.send(self._hello())
                    continue
                self._apply(plan)
        except Exception as error:
            if self.ranks is None:
                raise
            # A rank died or a collective failed: the group is broken. Exit; the scheduler
            # fails the in-flight requests, `folio serve` starts a new group.
            reason = self.ranks.dead_rank(wait_s=1.0) or error   # a collective's error
            log.error("tensor-parallel group failed (%s); stopping every rank", reason)
            # Said before exiting, so the in-flight requests fail naming the rank.
            self.sock.send(m.encode_executor_error(
                self.last_step_id, f"tensor-parallel group failed: {reason}"))
            self.linger_ms = 1000
            raise SystemExit(1) from None
        finally:
            self.stop.set()
            if self.ranks is not None:
                self.ranks.stop()
            self.heartbeat.join(timeout=1)
            monitor.close(0)
            self.sock.close(self.linger_ms)
            self.ctx.term()

    def _lora_update(self, update) -> bytes:
        """Load or unload an adapter (docs/lora.md); the answer says why not, if not."""
        registry = self.executor.lora
        error = None
        try:
            if registry is None:
                error = "LoRA adapters are off (start with --enable-lora)"
            elif self.ranks is not None:
                error = ("adapters are not loaded or unloaded while serving with tensor "
                         "parallelism (every rank would have to); list them in --lora-modules")
            elif update.path is None:
                registry.unload(update.name)
            else:
                started = time.perf_counter()
                registry.load(update.name, update.path)
                log.info("loaded LoRA adapter %r from %s in %.0f ms", update.name,
                         update.path, 1e3 * (time.perf_counter() - started))
        except ValueError as problem:   # LoraError: the cause, nothing kept
            error = str(problem)
        except Exception as problem:   # anything else reading the files: said, not fatal
            error = f"{type(problem).__name__}: {problem}"
        return m.encode_lora_updated(update.update_id, update.name, error)

    def _hello(self) -> bytes:
        """Capacity, pid and (tensor parallelism) every rank's pid, rank 0 first."""
        ranks = (os.getpid(), *self.ranks.pids) if self.ranks is not None else ()
        return m.encode_hello_executor(self.executor.capacity, os.getpid(), ranks)

    def _apply(self, plan) -> None:
        self.last_step_id = plan.step_id
        try:
            result = self.executor.execute(plan)
        except Exception as error:   # report, stay alive: the scheduler fails the step
            if self.ranks is not None:   # the ranks are out of step: the group must restart
                raise
            log.error("step %d failed: %s", plan.step_id, traceback.format_exc())
            self.sock.send(m.encode_executor_error(plan.step_id,
                                                   f"{type(error).__name__}: {error}"))
            return
        if not plan.is_empty:
            self.sock.send(m.encode_result(result))

    def _to_ranks(self, data: bytes) -> None:
        if self.ranks is not None:
            self.ranks.send(data)

    def _heartbeat_loop(self) -> None:
        sock = make_peer(configure(self.ctx.socket(zmq.DEALER)), self.keys)
        sock.setsockopt(zmq.IDENTITY,
                        f"executor-heartbeat-{os.getpid()}-{uuid.uuid4().hex[:6]}".encode())
        sock.connect(self.config.scheduler_address)
        send_heartbeats(sock, self.stop, m.encode_heartbeat(os.getpid()), HEARTBEAT_S)
