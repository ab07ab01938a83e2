"""Bounds on what HTTP connections may take from the frontend process (descriptors,
memory), and the Host names it answers.

Every open connection holds a file descriptor, silent ones too. Run out of descriptors and
libzmq, which cannot take EMFILE, aborts the process. So HTTP keeps at most
`connection_cap()` connections open, and no connection holds one for nothing: a request,
head and body, must arrive whole within REQUEST_TIMEOUT_S of the connection opening or of
the previous response (else a 408 and a close: half a header then silence, or a body that
never ends), and a keep-alive connection idle for IDLE_TIMEOUT_S after a response is closed
(uvicorn's keep-alive timeout). At the cap, a new connection takes the place of the one
whose request has been incomplete the longest (it gets a 408 and a close: it holds no work,
and new clients are served, not refused, while a slow-body flood lasts); with no such
connection it gets a 503 and a close. A request head larger than MAX_HEAD_BYTES gets a 431
and a close once that much has come (the parser would hold it all, one copy per chunk).
"""

from __future__ import annotations

import asyncio
import ipaddress
import logging
import resource
from typing import Any

log = logging.getLogger("folio.frontend")
MAX_HTTP_CONNECTIONS = 4096
REQUEST_TIMEOUT_S = 10.0
HEADER_TIMEOUT_S = REQUEST_TIMEOUT_S   # the name earlier callers use: the same deadline
IDLE_TIMEOUT_S = 5.0
MAX_HEAD_BYTES = 64 * 1024   # request line and headers, as nginx and most servers allow


def _answer(status: bytes, message: bytes, kind: bytes, code: bytes,
            extra: bytes = b"") -> bytes:
    """A whole HTTP/1.1 answer with OpenAI's error envelope, then the connection closes."""
    body = (b'{"error": {"message": "%s", "type": "%s", "param": null, "code": "%s"}}'
            % (message, kind, code))
    return (b"HTTP/1.1 %s\r\nContent-Type: application/json\r\n%sConnection: close\r\n"
            b"Content-Length: %d\r\n\r\n" % (status, extra, len(body)) + body)


_REFUSAL = _answer(b"503 Service Unavailable", b"too many open HTTP connections; retry later",
                   b"service_unavailable", b"too_many_connections", b"Retry-After: 1\r\n")


def _late_request(timeout_s: float) -> bytes:
    """The 408 a connection gets when its request (head and body) does not come in time."""
    return _answer(b"408 Request Timeout", b"the request (head and body) did not arrive "
                   b"whole within %g s" % timeout_s, b"invalid_request_error",
                   b"request_timeout")


_EVICTED = _answer(b"408 Request Timeout", b"the request was still incomplete when the "
                   b"server, at its connection cap, needed the connection for another client",
                   b"invalid_request_error", b"request_timeout")


def _head_too_large(limit: int) -> bytes:
    return _answer(b"431 Request Header Fields Too Large", b"the request head (request line "
                   b"and headers) is larger than %d bytes" % limit, b"invalid_request_error",
                   b"request_head_too_large")


def connection_cap() -> int:
    """Connections HTTP may hold: a quarter of the descriptor limit (at least 64) stays free."""
    soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft == resource.RLIM_INFINITY:
        return MAX_HTTP_CONNECTIONS
    return max(8, min(MAX_HTTP_CONNECTIONS, soft - max(64, soft // 4)))


def _often(count: int) -> bool:
    """Whether the count-th event of a kind is logged: 1, 10, 100, then every 1000th."""
    return count in (1, 10, 100) or count % 1000 == 0


class ConnectionGate:
    """Counts the HTTP connections open; `admit` is False past the cap unless a connection
    with an incomplete request could be closed to make room. `incomplete` holds those
    connections, oldest request first."""

    def __init__(self, cap: int) -> None:
        self.cap, self.open, self.refused, self.evicted = cap, 0, 0, 0
        self.incomplete: dict[Any, None] = {}   # an insertion-ordered set

    def admit(self) -> bool:
        if self.open >= self.cap:
            if self.incomplete:
                oldest = next(iter(self.incomplete))
                self.incomplete.pop(oldest)
                oldest.evict()   # its descriptor is freed as soon as the close completes
                self.evicted += 1
                if _often(self.evicted):
                    log.warning("HTTP: %d connections open, the cap; closed %d whose request "
                                "was incomplete, to serve new ones", self.open, self.evicted)
            else:
                self.refused += 1
                if _often(self.refused):
                    log.warning("HTTP: %d connections open, the cap; refused %d so far",
                                self.open, self.refused)
                return False
        self.open += 1
        return True

    def began(self, connection: Any) -> None:
        self.incomplete[connection] = None

    def whole(self, connection: Any) -> None:
        self.incomplete.pop(connection, None)

    def release(self, connection: Any = None) -> None:
        self.open -= 1
        self.incomplete.pop(connection, None)


def gated(protocol: type[asyncio.Protocol], gate: ConnectionGate,
          request_timeout_s: float = REQUEST_TIMEOUT_S,
          max_head_bytes: int = MAX_HEAD_BYTES) -> type[asyncio.Protocol]:
    """uvicorn's httptools protocol class, with the connection cap (evicting the stalest
    incomplete request), the whole-request deadline and the head size limit above."""
    late = _late_request(request_timeout_s)
    too_large = _head_too_large(max_head_bytes)

    class Gated(protocol):   # type: ignore[misc, valid-type]
        admitted = False
        deadline: asyncio.TimerHandle | None = None
        # idle: no request begun; head, body: arriving; whole: arrived, being answered
        phase = "idle"
        head_bytes = 0

        def connection_made(self, transport) -> None:
            if not gate.admit():
                transport.write(_REFUSAL)
                transport.close()   # flushes the refusal, then frees the descriptor
                return
            self.admitted = True
            super().connection_made(transport)
            self._arm()

        def _arm(self) -> None:
            """One timer per connection, armed while no whole request is being served (not
            a poll): when it fires, the next request has not come whole."""
            if self.deadline is not None:
                self.deadline.cancel()
            self.deadline = asyncio.get_running_loop().call_later(
                request_timeout_s, self._deadline_passed)

        def _deadline_passed(self) -> None:
            self.deadline = None
            cycle = getattr(self, "cycle", None)
            if self.phase == "whole" or (self.phase == "body" and cycle is not None
                                         and cycle.response_started
                                         and not cycle.response_complete):
                return   # being answered; the response re-arms the timer when it completes
            self._close_with(late)

        def _close_with(self, answer: bytes) -> None:
            if not self.transport.is_closing():
                cycle = getattr(self, "cycle", None)
                if cycle is None or not cycle.response_started or cycle.response_complete:
                    self.transport.write(answer)
                self.transport.close()

        def evict(self) -> None:
            self._close_with(_EVICTED)

        def data_received(self, data: bytes) -> None:
            if not self.admitted:
                return
            if self.phase == "idle":
                self.phase, self.head_bytes = "head", 0
                gate.began(self)
            in_head = self.phase == "head"
            super().data_received(data)
            if in_head and self.phase == "head":   # still no end of head: count it
                self.head_bytes += len(data)
                if self.head_bytes > max_head_bytes:
                    gate.whole(self)
                    self._close_with(too_large)

        def on_headers_complete(self) -> None:
            if self.phase == "head":
                self.phase = "body"
            super().on_headers_complete()

        def on_message_complete(self) -> None:
            super().on_message_complete()
            cycle = getattr(self, "cycle", None)
            if self.phase == "body" and cycle is not None and not cycle.response_complete:
                self.phase = "whole"
                gate.whole(self)

        def on_response_complete(self) -> None:
            pipelined = bool(getattr(self, "pipeline", None))
            super().on_response_complete()
            if self.admitted and not self.transport.is_closing():
                if not pipelined:   # a pipelined request keeps the phase it reached
                    self.phase = "idle"
                    gate.whole(self)
                self._arm()

        def eof_received(self):
            return super().eof_received() if self.admitted else None

        def connection_lost(self, exc) -> None:
            if self.admitted:
                self.admitted = False
                if self.deadline is not None:
                    self.deadline.cancel()
                gate.release(self)
                super().connection_lost(exc)

    return Gated


LOOPBACK_NAMES = frozenset({"localhost", "127.0.0.1", "::1"})


def allowed_hosts(bind_host: str, flag: str | None) -> frozenset[str] | None:
    """The Host names HTTP answers (None: any). A server on loopback answers only loopback
    names by default: a page whose DNS name is re-pointed at 127.0.0.1 (DNS rebinding) sends
    its own name. `flag`: comma-separated names, or "*" for any."""
    if flag is not None and flag.strip():
        names = {name.strip().lower().rstrip(".") for name in flag.split(",")}
        return None if "*" in names else frozenset(names - {""})
    try:
        loopback = ipaddress.ip_address(bind_host.strip("[]")).is_loopback
    except ValueError:
        loopback = bind_host.lower() == "localhost"
    return LOOPBACK_NAMES | {bind_host.strip("[]").lower()} if loopback else None


def host_name(header: str) -> str:
    """The name of a Host header: "[::1]:8000" -> "::1", "Example.COM.:80" -> "example.com"."""
    header = header.strip().lower()
    if header.startswith("["):
        return header[1:].split("]", 1)[0]
    return header.rsplit(":", 1)[0].rstrip(".") if header.count(":") == 1 else header.rstrip(".")
