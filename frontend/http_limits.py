"""Bounds on what HTTP connections may take from the frontend process (descriptors), and
the Host names it answers.

Every open connection holds a file descriptor, silent ones too. Run out of descriptors and
libzmq, which cannot take EMFILE, aborts the process. So HTTP keeps at most
`connection_cap()` connections open and answers any more with a 503 and a close, leaving
the rest of the descriptors to ZeroMQ, the tokenizer's files and the scheduler link; and no
connection holds one for nothing: a request head (request line and headers) must arrive
whole within HEADER_TIMEOUT_S of the connection opening or of the previous response (else a
408 and a close: a client that sends half a header and stalls), and a keep-alive connection
idle for IDLE_TIMEOUT_S after a response is closed (uvicorn's keep-alive timeout).
"""

from __future__ import annotations

import asyncio
import ipaddress
import logging
import resource

log = logging.getLogger("folio.frontend")
MAX_HTTP_CONNECTIONS = 4096
HEADER_TIMEOUT_S = 10.0
IDLE_TIMEOUT_S = 5.0
_BODY = (b'{"error": {"message": "too many open HTTP connections; retry later", "type": '
         b'"service_unavailable", "param": null, "code": "too_many_connections"}}')
_REFUSAL = (b"HTTP/1.1 503 Service Unavailable\r\nContent-Type: application/json\r\n"
            b"Retry-After: 1\r\nConnection: close\r\nContent-Length: %d\r\n\r\n"
            % len(_BODY) + _BODY)


def _slow_head(timeout_s: float) -> bytes:
    """The 408 a connection gets when its request head does not come in time."""
    body = (b'{"error": {"message": "the request head did not arrive within %g s", '
            b'"type": "invalid_request_error", "param": null, "code": "request_timeout"}}'
            % timeout_s)
    return (b"HTTP/1.1 408 Request Timeout\r\nContent-Type: application/json\r\n"
            b"Connection: close\r\nContent-Length: %d\r\n\r\n" % len(body) + body)


def connection_cap() -> int:
    """Connections HTTP may hold: a quarter of the descriptor limit (at least 64) stays free."""
    soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft == resource.RLIM_INFINITY:
        return MAX_HTTP_CONNECTIONS
    return max(8, min(MAX_HTTP_CONNECTIONS, soft - max(64, soft // 4)))


class ConnectionGate:
    """Counts the HTTP connections open; `admit` is False past the cap."""

    def __init__(self, cap: int) -> None:
        self.cap, self.open, self.refused = cap, 0, 0

    def admit(self) -> bool:
        if self.open >= self.cap:
            self.refused += 1
            if self.refused in (1, 10, 100) or self.refused % 1000 == 0:
                log.warning("HTTP: %d connections open, the cap; refused %d so far",
                            self.open, self.refused)
            return False
        self.open += 1
        return True

    def release(self) -> None:
        self.open -= 1


def gated(protocol: type[asyncio.Protocol], gate: ConnectionGate,
          header_timeout_s: float = HEADER_TIMEOUT_S) -> type[asyncio.Protocol]:
    """uvicorn's HTTP protocol class, refusing connections past the gate's cap and closing
    those whose request head does not arrive within header_timeout_s."""
    slow_head = _slow_head(header_timeout_s)

    class Gated(protocol):   # type: ignore[misc, valid-type]
        admitted = False
        head_timer: asyncio.TimerHandle | None = None

        def connection_made(self, transport) -> None:
            if not gate.admit():
                transport.write(_REFUSAL)
                transport.close()   # flushes the refusal, then frees the descriptor
                return
            self.admitted = True
            super().connection_made(transport)
            self._await_head()

        def _await_head(self) -> None:
            """One timer per connection, armed while no request is being served (not a
            poll): when it fires, the next request's head has not come whole."""
            if self.head_timer is not None:
                self.head_timer.cancel()
            self.head_timer = asyncio.get_running_loop().call_later(
                header_timeout_s, self._head_timeout)

        def _head_timeout(self) -> None:
            self.head_timer = None
            cycle = getattr(self, "cycle", None)
            if cycle is not None and not cycle.response_complete:
                return   # its head came; the response re-arms the timer when it completes
            if not self.transport.is_closing():
                self.transport.write(slow_head)
                self.transport.close()

        def on_response_complete(self) -> None:
            super().on_response_complete()
            if self.admitted and not self.transport.is_closing():
                self._await_head()

        def data_received(self, data: bytes) -> None:
            if self.admitted:
                super().data_received(data)

        def eof_received(self):
            return super().eof_received() if self.admitted else None

        def connection_lost(self, exc) -> None:
            if self.admitted:
                self.admitted = False
                if self.head_timer is not None:
                    self.head_timer.cancel()
                gate.release()
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
