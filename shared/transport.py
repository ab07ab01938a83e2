"""ZeroMQ helpers: socket options every Folio socket gets, run directories, peer monitors."""

from __future__ import annotations

import os
import tempfile
import threading
from pathlib import Path

import zmq
from zmq.utils.monitor import parse_monitor_message

from shared.wire import MAX_MESSAGE_BYTES

# ZeroMQ heartbeats run in the I/O thread: a stopped or vanished peer is dropped after
# HEARTBEAT_TIMEOUT_MS even while our own thread is busy, and the monitor reports it.
HEARTBEAT_IVL_MS = 300
HEARTBEAT_TIMEOUT_MS = 1200


def configure(sock: zmq.Socket, max_message_bytes: int = MAX_MESSAGE_BYTES) -> zmq.Socket:
    sock.setsockopt(zmq.LINGER, 0)
    sock.setsockopt(zmq.MAXMSGSIZE, max_message_bytes)
    sock.setsockopt(zmq.HEARTBEAT_IVL, HEARTBEAT_IVL_MS)
    sock.setsockopt(zmq.HEARTBEAT_TIMEOUT, HEARTBEAT_TIMEOUT_MS)
    sock.setsockopt(zmq.HEARTBEAT_TTL, HEARTBEAT_TIMEOUT_MS)
    sock.setsockopt(zmq.RECONNECT_IVL, 100)
    sock.setsockopt(zmq.RECONNECT_IVL_MAX, 1000)
    sock.setsockopt(zmq.SNDHWM, 100_000)
    sock.setsockopt(zmq.RCVHWM, 100_000)
    return sock


def make_run_dir() -> Path:
    """A private directory (mode 0700) for ipc:// sockets."""
    base = os.environ.get("XDG_RUNTIME_DIR") or tempfile.gettempdir()
    path = Path(tempfile.mkdtemp(prefix="folio-", dir=base))
    path.chmod(0o700)
    return path


def ipc_address(run_dir: Path, name: str) -> str:
    return f"ipc://{run_dir / name}.sock"


def check_bind_address(address: str) -> str:
    """Refuse wildcard binds unless asked for explicitly (compose sets FOLIO_ALLOW_WILDCARD)."""
    if not address.startswith(("ipc://", "tcp://", "inproc://")):
        raise ValueError(f"address {address!r} must start with ipc://, tcp:// or inproc://")
    host = address.removeprefix("tcp://").rsplit(":", 1)[0] if address.startswith("tcp://") \
        else ""
    if host in ("*", "0.0.0.0", "[::]") and os.environ.get("FOLIO_ALLOW_WILDCARD") != "1":
        raise ValueError(f"refusing to bind {address}: give a specific interface, or set "
                         "FOLIO_ALLOW_WILDCARD=1 where every interface is meant (containers)")
    return address


# On a connecting socket (one peer) these monitor events mean "the peer is there / gone".
UP_EVENTS = zmq.EVENT_HANDSHAKE_SUCCEEDED
DOWN_EVENTS = zmq.EVENT_DISCONNECTED


def monitor_socket(sock: zmq.Socket) -> zmq.Socket:
    return sock.get_monitor_socket(UP_EVENTS | DOWN_EVENTS)


def read_monitor_event(monitor: zmq.Socket) -> int:
    """The event code of one monitor message (call when the monitor is readable)."""
    return parse_monitor_message(monitor.recv_multipart())["event"]


def send_heartbeats(sock: zmq.Socket, stop: threading.Event, beat: bytes,
                    interval_s: float) -> None:
    """Send `beat` every `interval_s` from a thread of its own (proof of life even while the
    main thread computes); closes `sock` once `stop` is set."""
    try:
        while not stop.wait(interval_s):
            try:
                sock.send(beat, zmq.NOBLOCK)
            except zmq.Again:
                pass
    finally:
        sock.close(0)
