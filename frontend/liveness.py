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
        # stop() writes a byte here: the thread's poll wakes at once, not at the next beat.
        self._wake_read, self._wake_write = os.pipe()
        self.thread = threading.Thread(target=self._run, name="folio-heartbeat", daemon=True)

    def start(self) -> None:
        self.thread.start()

    def stop(self) -> None:
        if self.stopping.is_set():
            return
        self.stopping.set()
        os.write(self._wake_write, b"x")
        if self.thread.is_alive():
            self.thread.join(timeout=2)
        if not self.thread.is_alive():   # else it may still poll the pipe: leave it open
            os.close(self._wake_read)
            os.close(self._wake_write)

    def _run(self) -> None:
        sock = make_peer(configure(self.ctx.socket(zmq.DEALER)), self.keys)
        sock.connect(self.address)
        beat = m.encode_heartbeat(os.getpid(), self.frontend_id)
        poller = zmq.Poller()
        poller.register(sock, zmq.POLLIN)
        poller.register(self._wake_read, zmq.POLLIN)
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
                ready = dict(poller.poll(max(1, int((next_beat - now) * 1000))))
                if sock in ready:
                    while sock.poll(0, zmq.POLLIN):
                        sock.recv(zmq.NOBLOCK)   # any answer is proof of life
                    self.seen = time.monotonic()
        finally:
            sock.close(0)
