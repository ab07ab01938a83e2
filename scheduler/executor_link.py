"""The scheduler process's view of its executor: which peer of the executor socket it is
(its hello), whether it is alive (heartbeats from its own thread, so a long forward pass
cannot starve them; a step that takes too long; a probe after a disconnect), and the words
the scheduler sends it besides plans (ping, reset).

The service owns the socket and the Scheduler; this decides who the executor is and when
it is lost, and says why."""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass

import zmq

from folio.shared.protocol import messages as m
from folio.shared.config import ExecutorCapacity

PROBE_WINDOW_S = 0.5   # after a disconnect on the executor socket, probe the executor this long


@dataclass(frozen=True)
class ExecutorTimeouts:
    heartbeat_s: float   # no heartbeat for this long: dead
    step_s: float        # a step running this long: hung


class ExecutorLink:
    def __init__(self, sock: zmq.Socket, timeouts: ExecutorTimeouts,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.sock = sock   # the executor ROUTER (ROUTER_MANDATORY: a send to a gone peer fails)
        self.timeouts = timeouts
        self.clock = clock
        self.identity: bytes | None = None   # routing id of the attached executor
        self.pid = 0
        self.last_heard = 0.0
        self.capacity: ExecutorCapacity | None = None   # the last one attached (kept after)
        self.ranks: tuple[int, ...] = ()
        self.probe_until = 0.0   # probe the executor until then (a peer disconnected)

    def on_heartbeat(self, pid: int) -> None:
        if pid == self.pid:
            self.last_heard = self.clock()

    def is_another_live_executor(self, identity: bytes) -> bool:
        """A hello from a peer other than the attached executor, which is still alive:
        ignored (any peer may connect to the socket; it does not displace a working one)."""
        return (self.identity is not None and identity != self.identity
                and self.clock() - self.last_heard < self.timeouts.heartbeat_s)

    def attach(self, identity: bytes, pid: int, capacity: ExecutorCapacity,
               ranks: tuple[int, ...] = ()) -> None:
        self.identity, self.pid, self.capacity = identity, pid, capacity
        self.ranks = ranks   # tensor-parallel ranks' pids (kept after a loss, for health)
        self.last_heard = self.clock()

    def detach(self) -> None:
        self.identity = None
        self.pid = -1

    def send(self, payload: bytes) -> bool:
        """Send to the attached executor; False: its connection is gone."""
        try:
            self.sock.send_multipart([self.identity, payload], zmq.NOBLOCK)
        except zmq.ZMQError:
            return False
        return True

    def lose(self) -> None:
        """Give the executor up. A hung (not dead) one gets a reset once it is free again:
        it drops its state and says hello, and service resumes."""
        if self.identity is not None:
            self.send(m.encode_reset())
        self.detach()

    def on_peer_disconnected(self) -> None:
        """Some peer of the executor socket disconnected. Any peer may connect there, so
        ask the ROUTER, for a short while, whether the executor itself is still reachable:
        a killed executor is noticed in milliseconds instead of after the heartbeat
        timeout."""
        self.probe_until = self.clock() + PROBE_WINDOW_S

    def loss(self, step_running_since: float | None) -> str | None:
        """Why the attached executor is lost (its connection closed, no heartbeat, a step
        past its timeout), or None while it is fine. `step_running_since`: when the step
        it is on began, None when it owes no result."""
        reason = self._probe()
        if reason is not None:
            return reason
        now = self.clock()
        if now - self.last_heard > self.timeouts.heartbeat_s:
            return (f"the executor stopped responding (no heartbeat for "
                    f"{self.timeouts.heartbeat_s:.1f} s)")
        if step_running_since is not None and now - step_running_since > self.timeouts.step_s:
            return f"the executor did not finish a step within {self.timeouts.step_s:.0f} s"
        return None

    def _probe(self) -> str | None:
        if self.identity is None or self.clock() > self.probe_until:
            return None
        # Reading EVENTS makes the socket process pending pipe terminations first;
        # a plain send may skip that for a while (libzmq throttles command processing).
        self.sock.getsockopt(zmq.EVENTS)
        if not self.send(m.encode_ping()):
            return "the executor's connection closed"
        return None
