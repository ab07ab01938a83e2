"""Proof of life between a frontend and the scheduler, on a thread with its own socket.

The event loop may be busy for seconds (a flood of client messages, a huge chat template);
this thread is not. It sends `heartbeat` (with the frontend id) every `interval_s` and
records when the scheduler last answered one, so a busy frontend is neither given up by the
scheduler nor believes the scheduler dead: slow is not dead.
"""

from __future__ import annotations

import os
import threading
import time

import zmq

from folio.shared.protocol import messages as m
from folio.shared.security import CurveKeys, make_peer
from folio.shared.transport import configure


class SchedulerHeartbeat:
    def __init__(self, ctx: zmq.Context, address: str, frontend_id: str,
                 keys: CurveKeys | None, interval_s: float) -> None:
        self.ctx, self.address, self.keys = ctx, address, keys
        self.frontend_id, self.interval_s = frontend_id, interval_s
        self.seen = 0.0   # monotonic time of the scheduler's last answer (thread writes it)
        self.stopping = threading.Event()
        self.thread = threading.Thread(target=self._run, name="folio-heartbeat", daemon=True)

    def start(self) -> None:
        self.thread.start()

    def stop(self) -> None:
        self.stopping.set()
        if self.thread.is_alive():
            self.thread.join(timeout=2)

    def _run(self) -> None:
        sock = make_peer(configure(self.ctx.socket(zmq.DEALER)), self.keys)
        sock.connect(self.address)
        beat = m.encode_heartbeat(os.getpid(), self.frontend_id)
        next_beat = 0.0
        try:
            while not self.stopping.is_set():
                now = time.monotonic()
                if now >= next_beat:
                    try:
                        sock.send(beat, zmq.NOBLOCK)
                    except zmq.Again:
                        pass
                    next_beat = now + self.interval_s
                if sock.poll(max(1, int((next_beat - now) * 1000)), zmq.POLLIN):
                    while sock.poll(0, zmq.POLLIN):
                        sock.recv(zmq.NOBLOCK)   # any answer is proof of life
                    self.seen = time.monotonic()
        finally:
            sock.close(0)
