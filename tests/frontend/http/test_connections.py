"""HTTP connections hold no descriptor for nothing (issue 14 item 5): a request head must
arrive whole in time, an idle keep-alive connection is closed, and past the connection cap
a connection gets a clear 503. Real sockets against the frontend's uvicorn settings
(`http_config`, the ones `serve_http` uses) with short timeouts, in a thread of this process.
"""

from __future__ import annotations

import asyncio
import socket
import time

import pytest

from folio.frontend.http.limits import ConnectionGate
from tests.http_server import uvicorn_in_thread

TIMEOUT_S = 0.6


async def _app(scope, receive, send) -> None:
    """A plain ASGI app: /slow answers after 2 timeouts (a request being served is never
    cut), anything else at once."""
    if scope["type"] != "http":
        return
    while (await receive()).get("more_body"):
        pass
    if scope["path"] == "/slow":
        await asyncio.sleep(2 * TIMEOUT_S)
    await send({"type": "http.response.start", "status": 200,
                "headers": [(b"content-type", b"text/plain"), (b"content-length", b"2")]})
    await send({"type": "http.response.body", "body": b"ok"})


@pytest.fixture(scope="module")
def server():
    gate = ConnectionGate(3)
    with uvicorn_in_thread(_app, gate, TIMEOUT_S, TIMEOUT_S) as port:
        yield port, gate


def _connect(port: int) -> socket.socket:
    sock = socket.create_connection(("127.0.0.1", port), timeout=5)
    sock.settimeout(5)
    return sock


def _read_to_close(sock: socket.socket) -> tuple[bytes, float]:
    """Everything the server sends until it closes, and when it closed."""
    data = b""
    while chunk := sock.recv(65536):
        data += chunk
    return data, time.monotonic()


def _wait_open(gate: ConnectionGate, count: int) -> None:
    deadline = time.monotonic() + 5
    while gate.open != count:
        assert time.monotonic() < deadline, f"{gate.open} connections open, not {count}"
        time.sleep(0.01)


def test_half_a_header_then_silence_gets_a_408_and_a_close(server):
    port, gate = server
    _wait_open(gate, 0)
    sock = _connect(port)
    start = time.monotonic()
    sock.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Le")
    data, closed = _read_to_close(sock)
    sock.close()
    assert data.startswith(b"HTTP/1.1 408 ") and b'"request_timeout"' in data, data
    assert TIMEOUT_S * 0.9 <= closed - start < TIMEOUT_S + 2


def test_a_connection_that_never_speaks_is_closed(server):
    port, gate = server
    _wait_open(gate, 0)
    sock = _connect(port)
    data, _ = _read_to_close(sock)
    sock.close()
    assert data.startswith(b"HTTP/1.1 408 ")
    _wait_open(gate, 0)   # its descriptor is back


def test_an_idle_keep_alive_connection_is_closed_after_its_answer(server):
    port, gate = server
    _wait_open(gate, 0)
    sock = _connect(port)
    sock.sendall(b"GET / HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n")
    answered = time.monotonic()
    data, closed = _read_to_close(sock)
    sock.close()
    assert data.startswith(b"HTTP/1.1 200 ") and data.endswith(b"ok"), data
    assert b"408" not in data and closed - answered < TIMEOUT_S + 2


def test_a_slow_answer_is_not_cut_and_the_next_request_on_the_connection_is_served(server):
    port, _ = server
    sock = _connect(port)
    sock.sendall(b"GET /slow HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n")
    first = b""
    while not first.endswith(b"ok"):
        first += sock.recv(65536)
    sock.sendall(b"GET / HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n")
    rest, _ = _read_to_close(sock)
    sock.close()
    assert first.startswith(b"HTTP/1.1 200 ") and rest.startswith(b"HTTP/1.1 200 "), rest


def test_past_the_cap_a_connection_gets_a_503_and_the_others_still_work(server):
    port, gate = server
    _wait_open(gate, 0)
    held = [_connect(port) for _ in range(3)]
    _wait_open(gate, 3)
    extra = _connect(port)
    refused, _ = _read_to_close(extra)
    extra.close()
    assert refused.startswith(b"HTTP/1.1 503 ") and b"too_many_connections" in refused
    held[0].sendall(b"GET / HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n")
    served, _ = _read_to_close(held[0])
    assert served.startswith(b"HTTP/1.1 200 ")
    for sock in held:
        sock.close()
    _wait_open(gate, 0)   # the silent ones timed out or closed: a new client gets in
    again = _connect(port)
    again.sendall(b"GET / HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n")
    answer, _ = _read_to_close(again)
    again.close()
    assert answer.startswith(b"HTTP/1.1 200 ")
