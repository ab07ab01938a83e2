"""Reliability IV (issue 25, items 5 and 7): what a careless or hostile HTTP client can do at
the connection level. Bodies that never finish are cut at the request deadline and never
lock other clients out (at the connection cap the stalest incomplete request makes room);
a client leaving mid-body costs no traceback; a request head past 64 KiB gets a 431; two
Host headers get a 400.

The frontend's own app (`create_app`, a stub engine: no route here reaches the engine) on
the frontend's uvicorn settings (`http_config`), in a thread, with a short deadline.
"""

from __future__ import annotations

import json
import logging
import socket
import time

import pytest

from folio.frontend.http.limits import ConnectionGate
from folio.frontend.http.server import create_app
from folio.frontend.input_processor import ModelFacts
from tests.http_server import uvicorn_in_thread

DEADLINE_S = 1.0
CAP = 6


class _Engine:   # what /health, /v1/models and a refused completion read
    observers: list = []
    max_model_len = 64
    facts = ModelFacts(vocab_size=256, max_model_len=64, max_logprobs=20, max_n=64)
    draining = False
    engine_alive = True
    pooling = None   # the generate runner
    tokenizer = None
    loras: tuple[str, ...] = ()

    def replica_health(self) -> None:   # one scheduler, no replicas
        return None

    def rank_health(self) -> list:
        return []


@pytest.fixture(scope="module")
def server():
    gate = ConnectionGate(CAP)
    with uvicorn_in_thread(create_app(_Engine(), "tiny"), gate, DEADLINE_S, DEADLINE_S) as port:
        yield port, gate


def _connect(port: int) -> socket.socket:
    sock = socket.create_connection(("127.0.0.1", port), timeout=10)
    sock.settimeout(10)
    return sock


def _read_to_close(sock: socket.socket) -> bytes:
    data = b""
    try:
        while chunk := sock.recv(65536):
            data += chunk
    except ConnectionResetError:
        pass
    return data


def _wait_open(gate: ConnectionGate, count: int) -> None:
    deadline = time.monotonic() + 10
    while gate.open != count:
        assert time.monotonic() < deadline, f"{gate.open} connections open, not {count}"
        time.sleep(0.01)


def _wait_seen(gate: ConnectionGate, count: int, evicted_before: int) -> None:
    """Until the server has read the start of `count` requests (it cannot know of a request
    whose bytes it has not read yet)."""
    deadline = time.monotonic() + 10
    while len(gate.incomplete) + gate.evicted - evicted_before < count:
        assert time.monotonic() < deadline, f"the server saw {len(gate.incomplete)} requests"
        time.sleep(0.01)


def _get(port: int, path: str) -> bytes:
    sock = _connect(port)
    sock.sendall(f"GET {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n"
                 .encode())
    answer = _read_to_close(sock)
    sock.close()
    return answer


def _body_of(answer: bytes) -> dict:
    return json.loads(answer.partition(b"\r\n\r\n")[2])


def _no_traceback(caplog) -> None:
    bad = [r for r in caplog.records if r.exc_info or "Traceback" in r.getMessage()
           or r.levelno >= logging.ERROR]
    assert not bad, [r.getMessage() for r in bad][:3]


HEAD = ("POST /v1/completions HTTP/1.1\r\nHost: 127.0.0.1\r\n"
        "Content-Type: application/json\r\n")
STALLS = {
    "a chunked body that never ends": (HEAD + "Transfer-Encoding: chunked\r\n\r\n"
                                       "5\r\n{\"pro\r\n").encode(),
    "a Content-Length larger than what is sent": (HEAD + "Content-Length: 1000\r\n\r\n"
                                                  '{"prompt": "').encode(),
}


@pytest.mark.parametrize("stall", STALLS, ids=list(STALLS))
def test_a_body_that_never_ends_neither_locks_others_out_nor_logs_a_traceback(
        server, caplog, stall):
    port, gate = server
    _wait_open(gate, 0)
    caplog.set_level(logging.INFO)
    attackers, evicted_before = [], gate.evicted
    for sent in range(1, CAP + 4):   # more than the cap: the oldest make room for the newest
        sock = _connect(port)
        sock.sendall(STALLS[stall])
        attackers.append(sock)
        _wait_seen(gate, sent, evicted_before)
    # Bystanders while every slot is held by an incomplete request: each one is served.
    for _ in range(3):
        health = _get(port, "/health")
        assert health.startswith(b"HTTP/1.1 200 "), health[:200]
        models = _get(port, "/v1/models")
        assert models.startswith(b"HTTP/1.1 200 ") and b'"tiny"' in models
    # Every attacker is closed by the server (made room for another, or past the deadline),
    # with a 408 that says why, or nothing when it was cut before the first one's answer.
    for sock in attackers:
        answer = _read_to_close(sock)
        sock.close()
        assert answer.startswith(b"HTTP/1.1 408 "), answer[:200]
        assert _body_of(answer)["error"]["code"] == "request_timeout"
    _wait_open(gate, 0)
    assert _get(port, "/health").startswith(b"HTTP/1.1 200 ")
    _no_traceback(caplog)


def test_a_client_that_leaves_mid_body_costs_no_traceback(server, caplog):
    port, gate = server
    _wait_open(gate, 0)
    caplog.set_level(logging.INFO)
    for _ in range(20):
        sock = _connect(port)
        sock.sendall(STALLS["a Content-Length larger than what is sent"])
        sock.close()
    _wait_open(gate, 0)
    time.sleep(0.2)   # let the handlers see the disconnect
    assert _get(port, "/health").startswith(b"HTTP/1.1 200 ")
    _no_traceback(caplog)


def test_a_request_head_past_64_kib_gets_a_431_and_a_close(server):
    port, gate = server
    sock = _connect(port)
    sock.sendall(b"GET /health HTTP/1.1\r\nHost: 127.0.0.1\r\n")
    padding = b"X-Pad: " + b"a" * 8000 + b"\r\n"
    try:
        for _ in range(4096):   # 32 MiB offered; the server stops reading long before
            sock.sendall(padding)
    except (BrokenPipeError, ConnectionResetError):
        pass
    answer = _read_to_close(sock)
    sock.close()
    assert answer.startswith(b"HTTP/1.1 431 "), answer[:200]
    assert _body_of(answer)["error"]["code"] == "request_head_too_large"
    assert b"65536 bytes" in answer
    _wait_open(gate, 0)
    # A long URL is part of the head too.
    sock = _connect(port)
    try:
        sock.sendall(b"GET /health?" + b"a" * 200_000 + b" HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n")
    except (BrokenPipeError, ConnectionResetError):
        pass
    answer = _read_to_close(sock)
    sock.close()
    assert answer.startswith(b"HTTP/1.1 431 "), answer[:200]


def test_a_head_just_under_the_limit_is_served(server):
    port, _ = server
    sock = _connect(port)
    sock.sendall(b"GET /health HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n"
                 b"X-Pad: " + b"a" * 60_000 + b"\r\n\r\n")
    answer = _read_to_close(sock)
    sock.close()
    assert answer.startswith(b"HTTP/1.1 200 "), answer[:200]


def test_two_host_headers_get_a_400(server):
    port, _ = server
    sock = _connect(port)
    sock.sendall(b"GET /v1/models HTTP/1.1\r\nHost: 127.0.0.1\r\nHost: evil.example\r\n"
                 b"Connection: close\r\n\r\n")
    answer = _read_to_close(sock)
    sock.close()
    assert answer.startswith(b"HTTP/1.1 400 "), answer[:200]
    error = _body_of(answer)["error"]
    assert error["code"] == "duplicate_host_header" and "Host" in error["message"]


def test_a_whole_request_with_a_body_is_served_on_a_busy_connection(server):
    """The deadline is per request: a keep-alive connection sending whole requests
    back to back is never cut."""
    port, _ = server
    sock = _connect(port)
    body = b'{"prompt": 1}'
    for _ in range(3):
        sock.sendall(HEAD.encode() + b"Content-Length: %d\r\n\r\n" % len(body) + body)
        answer = b""
        while b"}}" not in answer:
            chunk = sock.recv(65536)
            assert chunk, f"the server closed the connection after {answer[:300]!r}"
            answer += chunk
        assert answer.startswith(b"HTTP/1.1 400 ") and b'"prompt"' in answer, answer[:300]
        time.sleep(DEADLINE_S * 0.6)   # twice past the deadline, counted from the start
    sock.close()
