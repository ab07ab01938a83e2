"""The KV-event replay socket (scheduler/kv_event_publisher.py), served on a thread of its
own so that no replay peer costs the step loop anything, and bounded so that none can cost
the scheduler much memory or CPU either:

- the ROUTER refuses any inbound message over MAX_REQUEST_BYTES (ZMQ_MAXMSGSIZE: the
  connection that sends one is dropped before its frame is buffered) and queues at most
  RCVHWM requests;
- each peer may ask PER_PEER_PER_S replays a second (a burst of PER_PEER_BURST); a peer past
  it, or one that does not read its replays (its send queue full), is cut off for
  CUT_OFF_S: its requests are read and dropped, logged once;
- all peers together get at most TOTAL_BYTES_PER_S of replayed payload a second: past it,
  this thread waits (the step loop does not).

The batches kept for replay are shared with the publisher under a lock (KeptBatches)."""

from __future__ import annotations

import logging
import threading
import time
from collections import OrderedDict, deque
from dataclasses import dataclass

import zmq

log = logging.getLogger("folio.scheduler")

END_OF_REPLAY = (-1).to_bytes(8, "big", signed=True)


@dataclass(frozen=True)
class ReplayLimits:
    max_request_bytes: int = 1024       # a request is 8 bytes (and a REQ's empty frame)
    rcvhwm: int = 1000                  # requests queued in the socket
    sndhwm: int = 20_000                # replies queued per peer
    per_peer_per_s: float = 4.0
    per_peer_burst: int = 8
    total_bytes_per_s: int = 64 * 2**20
    cut_off_s: float = 60.0
    max_peers: int = 4096               # peers whose buckets are kept (the oldest go)


class KeptBatches:
    """The last `maxlen` published batches, (sequence, payload), shared by two threads."""

    def __init__(self, maxlen: int) -> None:
        self._batches: deque[tuple[int, bytes]] = deque(maxlen=maxlen)
        self._lock = threading.Lock()

    def append(self, seq: int, payload: bytes) -> None:
        with self._lock:
            self._batches.append((seq, payload))

    def since(self, first: int) -> list[tuple[int, bytes]]:
        with self._lock:
            return [batch for batch in self._batches if batch[0] >= first]


class _Bucket:
    __slots__ = ("tokens", "at")

    def __init__(self, tokens: float, at: float) -> None:
        self.tokens, self.at = tokens, at

    def take(self, amount: float, rate: float, cap: float, now: float) -> bool:
        self.tokens = min(cap, self.tokens + (now - self.at) * rate)
        self.at = now
        if self.tokens < amount:
            return False
        self.tokens -= amount
        return True


class ReplayServer:
    def __init__(self, ctx: zmq.Context, endpoint: str, kept: KeptBatches,
                 limits: ReplayLimits = ReplayLimits(),
                 clock=time.monotonic) -> None:
        self.kept, self.limits, self.clock = kept, limits, clock
        self.sock = ctx.socket(zmq.ROUTER)
        self.sock.setsockopt(zmq.LINGER, 0)
        self.sock.setsockopt(zmq.ROUTER_MANDATORY, 1)   # a full queue says so (EAGAIN)
        self.sock.setsockopt(zmq.MAXMSGSIZE, limits.max_request_bytes)
        self.sock.setsockopt(zmq.RCVHWM, limits.rcvhwm)
        self.sock.setsockopt(zmq.SNDHWM, limits.sndhwm)
        self.sock.bind(endpoint)   # checked with the config (kv_events_config.py)
        self.peers: OrderedDict[bytes, _Bucket] = OrderedDict()
        self.cut_off: dict[bytes, float] = {}   # peer -> until when
        self.total = _Bucket(limits.total_bytes_per_s, clock())
        self.counters = {"replays": 0, "refused": 0, "cut_off": 0}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="folio-kv-replay", daemon=True)
        self._thread.start()

    def close(self) -> None:
        self._stop.set()
        self._thread.join(timeout=5)
        self.sock.close(0)

    def _run(self) -> None:
        while not self._stop.is_set():
            if not self.sock.poll(100):
                continue
            try:
                frames = self.sock.recv_multipart(zmq.NOBLOCK)
            except zmq.Again:
                continue
            self._on_request(frames[0], frames[-1])

    def _on_request(self, peer: bytes, start: bytes) -> None:
        now = self.clock()
        until = self.cut_off.get(peer)
        if until is not None:
            if now < until:
                self.counters["refused"] += 1
                return
            del self.cut_off[peer]
        if len(start) != 8:
            return   # not a sequence number: nothing to answer
        limits = self.limits
        bucket = self.peers.pop(peer, None) or _Bucket(limits.per_peer_burst, now)
        self.peers[peer] = bucket   # most recent last
        if len(self.peers) > limits.max_peers:
            self.peers.popitem(last=False)
        if not bucket.take(1, limits.per_peer_per_s, limits.per_peer_burst, now):
            self._cut_off(peer, now, f"more than {limits.per_peer_per_s:g} replays a second")
            return
        self.counters["replays"] += 1
        for seq, payload in self.kept.since(int.from_bytes(start, "big")):
            self._pace(len(payload))
            if not self._send(peer, seq.to_bytes(8, "big"), payload):
                self._cut_off(peer, self.clock(), "it does not read its replays")
                return
        self._send(peer, END_OF_REPLAY, b"")

    def _pace(self, size: int) -> None:
        """Wait (this thread only) until the total byte budget allows `size` more."""
        limits = self.limits
        rate, cap = limits.total_bytes_per_s, limits.total_bytes_per_s
        size = min(size, cap)
        while not self.total.take(size, rate, cap, self.clock()):
            if self._stop.wait(min(1.0, size / rate)):
                return

    def _send(self, peer: bytes, seq: bytes, payload: bytes) -> bool:
        # A REQ peer expects the empty delimiter frame before its reply.
        try:
            self.sock.send_multipart((peer, b"", seq, payload), flags=zmq.NOBLOCK)
            return True
        except zmq.ZMQError:   # its queue is full (or it is gone)
            return False

    def _cut_off(self, peer: bytes, now: float, why: str) -> None:
        self.peers.pop(peer, None)
        self.cut_off[peer] = now + self.limits.cut_off_s
        if len(self.cut_off) > self.limits.max_peers:
            del self.cut_off[next(iter(self.cut_off))]
        self.counters["cut_off"] += 1
        log.warning("KV-event replay: cut off a peer for %.0f s: %s",
                    self.limits.cut_off_s, why)
