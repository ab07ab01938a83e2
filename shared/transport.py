"""ZeroMQ helpers: socket options every Folio socket gets, run directories, peer monitors."""

from __future__ import annotations

import ipaddress
import os
import socket
import tempfile
import threading
import time
from pathlib import Path

import zmq
from zmq.utils.monitor import parse_monitor_message

from folio.shared.protocol.wire import MAX_MESSAGE_BYTES

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


def send_now(sock: "zmq.asyncio.Socket", frames: list[bytes]) -> zmq.ZMQError | None:
    """Send `frames` on an asyncio socket without waiting: None when they left, else why not
    (zmq.Again: the peer's queue is full; EHOSTUNREACH: a ROUTER's peer is gone).

    A NOBLOCK send completes or fails at once while no other send waits (none of ours ever
    does), so its future is done on return; its error is read here, not left in the future
    (which would log "Future exception was never retrieved" once per failed message)."""
    sent = sock.send_multipart(frames, zmq.NOBLOCK)
    if not sent.done():   # not expected: read its outcome when it comes, all the same
        sent.add_done_callback(lambda f: f.cancelled() or f.exception())
        return None
    return None if sent.cancelled() else sent.exception()


async def next_monitor_event(monitor: "zmq.asyncio.Socket", timeout_s: float) -> int | None:
    """The next event on an asyncio monitor socket, or None when none came within timeout_s.

    Polls first and receives after, instead of asyncio.wait_for around the receive: on
    Python 3.11 wait_for returns a result that arrived together with a cancel and drops the
    cancel, so a watch loop around it (a monitor sees events every 100 ms while a handshake
    is refused) could never be cancelled, and a client's close() hung."""
    if not await monitor.poll(timeout_s * 1000, zmq.POLLIN):
        return None
    return parse_monitor_message(await monitor.recv_multipart())["event"]


def make_run_dir() -> Path:
    """A private directory (mode 0700) for ipc:// sockets."""
    base = os.environ.get("XDG_RUNTIME_DIR") or tempfile.gettempdir()
    path = Path(tempfile.mkdtemp(prefix="folio-", dir=base))
    path.chmod(0o700)
    return path


def ipc_address(run_dir: Path, name: str) -> str:
    return f"ipc://{run_dir / name}.sock"


def check_bind_address(address: str) -> str:
    """Refuse wildcard binds unless asked for explicitly (compose sets FOLIO_ALLOW_WILDCARD).

    A wildcard is any unspecified address however it is written (`*`, `0`, `0x0`, `[::0]`,
    `[::ffff:0.0.0.0]`, a name resolving to 0.0.0.0): the OS binds each to every interface."""
    if not address.startswith(("ipc://", "tcp://", "inproc://")):
        raise ValueError(f"address {address!r} must start with ipc://, tcp:// or inproc://")
    host = _tcp_host(address)
    if host is None or os.environ.get("FOLIO_ALLOW_WILDCARD") == "1":
        return address
    if _is_wildcard(host, address):
        raise ValueError(f"refusing to bind {address}: give a specific interface, or set "
                         "FOLIO_ALLOW_WILDCARD=1 where every interface is meant (containers)")
    return address


def _ip_literal(host: str) -> ipaddress.IPv4Address | ipaddress.IPv6Address | None:
    """`host` as an IP address when it is one in any form the OS accepts, else None.

    inet_aton reads IPv4's legacy forms too ("0", "0x0", "0.0.0.00", "127.1"), as the
    resolver ZeroMQ binds through does; it also ignores anything after a space, so a host
    with whitespace is no literal."""
    try:
        return ipaddress.ip_address(host)
    except ValueError:
        pass
    if not host or any(c.isspace() for c in host):
        return None
    try:
        return ipaddress.IPv4Address(socket.inet_aton(host))
    except OSError:
        return None


def _is_unspecified(ip: ipaddress.IPv4Address | ipaddress.IPv6Address) -> bool:
    """0.0.0.0 or ::, including the IPv4-mapped ::ffff:0.0.0.0."""
    mapped = getattr(ip, "ipv4_mapped", None)
    return ip.is_unspecified or (mapped is not None and mapped.is_unspecified)


def _is_wildcard(host: str, address: str) -> bool:
    """Whether binding `host` binds every interface; a ValueError when it names nothing."""
    if host in ("", "*"):
        return True
    ip = _ip_literal(host)
    if ip is not None:
        return _is_unspecified(ip)
    if _is_interface(host):   # ZeroMQ binds an interface name to that interface's address
        return False
    return any(_is_unspecified(ip) for ip in _resolve(host, address))


def _is_interface(name: str) -> bool:
    try:
        socket.if_nametoindex(name)
    except (OSError, ValueError):
        return False
    return True


def _resolve(host: str, address: str) -> list[ipaddress.IPv4Address | ipaddress.IPv6Address]:
    """Every address the name `host` resolves to (any of them could be the one bound)."""
    try:
        infos = socket.getaddrinfo(host, None, proto=socket.IPPROTO_TCP)
    except (OSError, UnicodeError) as error:
        raise ValueError(f"cannot bind {address}: host {host!r} does not resolve "
                         f"({error})") from None
    return [ipaddress.ip_address(info[4][0].partition("%")[0]) for info in infos]


INSECURE_HELP = ("allow tcp:// links without CURVE keys where others could reach them (any "
                 "interface but loopback; the executor's link on any tcp://). DANGEROUS: "
                 "anyone who can reach the port can submit work, read outputs and abort or "
                 "answer requests")


def _tcp_host(address: str) -> str | None:
    """The host of a tcp:// address, brackets stripped ("tcp://[::1]:5555" -> "::1"); None
    for other schemes."""
    if not address.startswith("tcp://"):
        return None
    rest = address.removeprefix("tcp://")
    if rest.startswith("["):   # IPv6 literal: its colons are not the port's
        return rest[1:].partition("]")[0]
    return rest.rsplit(":", 1)[0]


def is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:   # a name (resolved elsewhere), or a wildcard
        return False


def insecure_link(address: str, curve: bool, executor_link: bool = False) -> str | None:
    """Why `address` would be an unauthenticated link anyone could use, or None.

    Without CURVE, a peer that reaches a socket can speak for any frontend or executor. The
    private ipc:// run directory (mode 0700) and loopback TCP are reachable only from this
    machine; any other TCP address needs keys. The executor's link needs them on loopback
    too: any local user could attach an executor and answer plans."""
    host = _tcp_host(address)
    if curve or host is None:
        return None
    if executor_link:
        return (f"{address} carries the executor link over TCP without CURVE keys; use "
                "ipc:// or --curve-keys DIR (or --insecure-transport, dangerous)")
    if not is_loopback(host):
        return (f"{address} is reachable from other machines and has no CURVE keys; use "
                "--curve-keys DIR (or --insecure-transport, dangerous)")
    return None


# On a connecting socket (one peer) these monitor events mean "the peer is there / gone".
UP_EVENTS = zmq.EVENT_HANDSHAKE_SUCCEEDED
DOWN_EVENTS = zmq.EVENT_DISCONNECTED


def monitor_socket(sock: zmq.Socket) -> zmq.Socket:
    return sock.get_monitor_socket(UP_EVENTS | DOWN_EVENTS)


def read_monitor_event(monitor: zmq.Socket) -> int:
    """The event code of one monitor message (call when the monitor is readable)."""
    return parse_monitor_message(monitor.recv_multipart())["event"]


RELINK_AFTER_S = 1.5   # longer than RECONNECT_IVL_MAX: libzmq had its chance to reconnect


class Relink:
    """Connects a connecting socket afresh when its link stays down.

    libzmq reconnects by itself after a connection is lost, but not after a protocol error:
    a peer's message over MAXMSGSIZE (or a malformed frame) ends that session for good, and
    the socket would stay unlinked for as long as its process lives (an executor alive and
    idle, never saying hello again). Feed it the socket's monitor events and call `check`
    now and then: a link down for RELINK_AFTER_S without coming back is connected again."""

    def __init__(self, sock: zmq.Socket, address: str) -> None:
        self.sock, self.address = sock, address
        self.down_since: float | None = None
        self.relinks = 0

    def on_event(self, event: int) -> None:
        if event & UP_EVENTS:
            self.down_since = None
        elif event & DOWN_EVENTS:
            self.down_since = time.monotonic()

    def check(self) -> bool:
        """True when it connected the socket afresh."""
        now = time.monotonic()
        if self.down_since is None or now - self.down_since < RELINK_AFTER_S:
            return False
        try:   # ends the dead session (or a pending retry) of this endpoint
            self.sock.disconnect(self.address)
        except zmq.ZMQError:
            pass
        self.sock.connect(self.address)
        self.down_since = now   # still down until a handshake says otherwise
        self.relinks += 1
        return True


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
