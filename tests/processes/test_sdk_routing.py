"""Reliability III (issue 20): SDK routing that ids cannot cross, request bodies and SSE
backlogs that cannot grow the frontend without bound, an API key that never shows in `ps`,
and browser-facing refusals.

One `folio serve` with the HTTP API, its key from a file.
"""

from __future__ import annotations

import asyncio
import json
import os
import re
import resource
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest

from folio import SamplingParams
from folio.client import AsyncClient, Client
from folio.errors import RequestRejected
from tests.http_server import ROOT, HttpServer, free_port, serving

pytestmark = pytest.mark.slow
KEY = "sk-reliability-iii-secret"
AUTH = {"Authorization": f"Bearer {KEY}"}
GREEDY = dict(temperature=0, ignore_eos=True)


@pytest.fixture(scope="module")
def server(tmp_path_factory, llama_dir):
    run_dir = tmp_path_factory.mktemp("rel3")
    key_file = run_dir / "api.key"
    key_file.write_text(KEY + "\n")
    srv = HttpServer(llama_dir, run_dir, "--api-key-file", str(key_file),
                     "--num-kv-blocks", "512")
    try:
        srv.wait_ready()
        yield srv
    finally:
        srv.stop()


def _children(pid: int) -> list[int]:
    found = []
    for task in Path(f"/proc/{pid}/task").iterdir():
        for child in (task / "children").read_text().split():
            found += [int(child), *_children(int(child))]
    return found


def _frontend_pid(server) -> int:
    for pid in _children(server.proc.pid):
        # The process title, not any mention: the scheduler's flags name its frontends.
        if Path(f"/proc/{pid}/cmdline").read_bytes().startswith(b"folio-frontend"):
            return pid
    raise AssertionError("no frontend child")


def _idle_stats(server, timeout: float = 60.0) -> dict:
    deadline = time.monotonic() + timeout
    with Client(server.zmq_address) as client:
        while True:
            stats = client.health()["stats"]
            if (stats["kv_blocks_free"] == stats["kv_blocks_total"]
                    and stats["num_running"] == stats["num_waiting"] == 0):
                return stats
            if time.monotonic() > deadline:
                return stats
            time.sleep(0.1)


def _admitted_tokens(server) -> int:
    with Client(server.zmq_address) as client:
        return client.health()["stats"]["prefix_cache_queries"]


def _wait_running(server, timeout: float = 60.0, admitted_before: int | None = None) -> None:
    """Until a request runs, or (given the count before it was sent) has been admitted: a
    fast machine may run and abort it between two looks."""
    deadline = time.monotonic() + timeout
    with Client(server.zmq_address) as client:
        while True:
            stats = client.health()["stats"]
            if stats["num_running"] > 0 or (admitted_before is not None and
                                            stats["prefix_cache_queries"] > admitted_before):
                return
            assert time.monotonic() < deadline, "the request never started"
            time.sleep(0.05)


# ---- the SDK's routing ---------------------------------------------------------------------

def test_a_reused_request_id_never_gets_the_abandoned_calls_output(server):
    old_prompt, new_prompt = [7] * 30, [11, 22, 33, 44, 55]
    with Client(server.zmq_address) as client:
        expected = client.generate(new_prompt, SamplingParams(max_tokens=6, **GREEDY))
        for _ in range(20):
            stream = client.stream(old_prompt, SamplingParams(max_tokens=500, **GREEDY),
                                   request_id="dup")
            next(iter(stream))
            stream.close()   # abandoned: its abort and final are still on their way
            result = client.generate(new_prompt, SamplingParams(max_tokens=6, **GREEDY),
                                     request_id="dup")
            assert result.request_id == "dup"
            assert (result.finish_reason, result.token_ids) == ("length", expected.token_ids)
    assert _idle_stats(server)["kv_blocks_free"] == 512


def test_reusing_a_running_id_is_refused_and_the_running_call_goes_on(server):
    async def run():
        async with AsyncClient(server.zmq_address) as client:
            # As long as the context allows: it surely still runs when the second call
            # with its id arrives, on a far faster engine too.
            stream = client.stream([5] * 10, SamplingParams(max_tokens=1000, **GREEDY),
                                   request_id="busy")
            first = await stream.__anext__()
            with pytest.raises(RequestRejected, match="already running"):
                await client.generate([1, 2], SamplingParams(max_tokens=2), request_id="busy")
            rest = [delta async for delta in stream]
            return len(first.token_ids) + sum(len(d.token_ids) for d in rest)

    assert asyncio.run(run()) == 1000


def test_a_prompt_that_fills_the_context_without_max_tokens_is_refused(server):
    limit = httpx.get(f"{server.base}/v1/models", headers=AUTH).json()["data"][0][
        "max_model_len"]
    with Client(server.zmq_address) as client:
        with pytest.raises(RequestRejected, match="no room for a generated token"):
            client.generate([5] * limit, SamplingParams(max_tokens=None))
        fits = client.generate([5] * (limit - 1), SamplingParams(max_tokens=None, **GREEDY))
    assert len(fits.token_ids) == 1 and fits.finish_reason == "length"
    refused = httpx.post(f"{server.base}/v1/chat/completions", headers=AUTH, json={
        "messages": [{"role": "user", "content": "hi " * limit}]})
    assert refused.status_code == 400
    assert refused.json()["error"]["code"] == "context_length_exceeded"


# ---- request bodies ------------------------------------------------------------------------

def _hwm_kib(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1])
    raise AssertionError("no VmHWM")


def _raw_post(server, head: bytes, chunks, timeout: float = 30.0) -> bytes:
    """Send a request (stopping when the server closes), then read what it answered."""
    with socket.create_connection(("127.0.0.1", server.port), timeout=timeout) as sock:
        try:
            sock.sendall(head)
            for chunk in chunks:
                sock.sendall(chunk)
        except (BrokenPipeError, ConnectionResetError):
            pass
        answer = b""
        try:
            while not _complete(answer):
                data = sock.recv(65536)
                if not data:
                    break
                answer += data
        except ConnectionResetError:
            pass
        return answer


def _complete(answer: bytes) -> bool:
    head, sep, body = answer.partition(b"\r\n\r\n")
    length = re.search(rb"content-length: (\d+)", head, re.I)
    return bool(sep) and (length is None or len(body) >= int(length.group(1)))


def test_a_huge_chunked_body_is_refused_without_being_read(server):
    pid = _frontend_pid(server)
    before = _hwm_kib(pid)
    megabyte = b"a" * 2**20
    body = (b"%x\r\n" % len(megabyte) + megabyte + b"\r\n" for _ in range(256))
    head = (f"POST /v1/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nAuthorization: Bearer {KEY}"
            "\r\nContent-Type: application/json\r\nTransfer-Encoding: chunked\r\n\r\n").encode()
    answer = _raw_post(server, head, body)
    assert answer == b"" or answer.startswith(b"HTTP/1.1 400"), answer[:200]
    assert _hwm_kib(pid) - before < 128 * 1024   # the 256 MiB body was never held
    assert httpx.get(f"{server.base}/v1/models", headers=AUTH).status_code == 200


def test_a_content_length_over_the_limit_is_refused_before_the_body(server):
    head = (f"POST /v1/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nAuthorization: Bearer {KEY}"
            f"\r\nContent-Type: application/json\r\nContent-Length: {2**30}\r\n\r\n").encode()
    answer = _raw_post(server, head, [], timeout=20)   # no body sent: no waiting for it
    assert answer.startswith(b"HTTP/1.1 400"), answer[:200]
    assert b"exceeds" in answer


# ---- a stream that is never read -----------------------------------------------------------

NEVER_READ_TOKENS = 30_000   # per sample: far past the backlog at any engine speed


def test_a_stream_never_read_is_aborted_and_its_blocks_freed(long_llama_dir, tmp_path):
    # A server of its own on the 32768-token model: the 16 samples must still be running
    # when the unread backlog is judged (128 steps and a grace second after it fills), so
    # they ask for answers no engine, however fast, finishes by then.
    key_file = tmp_path / "api.key"
    key_file.write_text(KEY + "\n")
    body = json.dumps({"messages": [{"role": "user", "content": "hi"}], "stream": True,
                       "n": 16, "max_tokens": NEVER_READ_TOKENS, "logprobs": True,
                       "top_logprobs": 20, "ignore_eos": True}).encode()
    with serving(long_llama_dir, tmp_path, "--api-key-file", str(key_file),
                 "--num-kv-blocks", "2048") as server:
        head = (f"POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nAuthorization: "
                f"Bearer {KEY}\r\nContent-Type: application/json\r\nContent-Length: "
                f"{len(body)}\r\n\r\n").encode()
        admitted = _admitted_tokens(server)
        with socket.socket() as sock:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)   # a small window
            sock.settimeout(60)
            sock.connect(("127.0.0.1", server.port))
            sock.sendall(head + body)
            _wait_running(server, admitted_before=admitted)
            stats = _idle_stats(server, timeout=240)   # while nothing of the stream is read
            assert stats["kv_blocks_free"] == stats["kv_blocks_total"] == 2048, stats
            received = b""
            while not received.endswith(b"0\r\n\r\n"):
                data = sock.recv(2**20)
                if not data:
                    break
                received += data
    events = [line for line in received.split(b"\n") if line.startswith(b"data: ")]
    assert b"[DONE]" not in received
    assert b'"slow_reader"' in events[-1]
    assert len(events) < 16 * NEVER_READ_TOKENS   # it did not run to the end


# ---- descriptors ---------------------------------------------------------------------------

FD_LIMIT = 256


def _low_fd_limit() -> None:
    resource.setrlimit(resource.RLIMIT_NOFILE, (FD_LIMIT, FD_LIMIT))


def _http_health(port: int) -> int:
    try:
        return httpx.get(f"http://127.0.0.1:{port}/health", timeout=5).status_code
    except httpx.HTTPError:
        return -1


def test_silent_connections_past_the_descriptor_limit_are_refused_not_fatal(
        server, llama_dir, tmp_path):
    deadline = time.monotonic() + 60
    while not (found := re.search(r"run directory:\s+(\S+)", server.log.read_text())):
        assert time.monotonic() < deadline, "no banner"
        time.sleep(0.2)
    run_dir = found.group(1)
    port, address = free_port(), f"ipc://{tmp_path}/client.sock"
    env = dict(os.environ, PYTHONPATH=str(ROOT), PYTHONUNBUFFERED="1")
    proc = subprocess.Popen(   # a second frontend on the same scheduler, few descriptors
        [sys.executable, "-m", "folio", "frontend", "--model", str(llama_dir),
         "--client-address", address, "--port", str(port),
         "--scheduler-address", f"ipc://{run_dir}/scheduler-frontends.sock"],
        cwd=ROOT, env=env, preexec_fn=_low_fd_limit,
        stdout=open(tmp_path / "frontend.log", "wb"), stderr=subprocess.STDOUT)
    silent: list[socket.socket] = []
    try:
        deadline = time.monotonic() + 120
        while _http_health(port) != 200:
            assert proc.poll() is None and time.monotonic() < deadline, \
                (tmp_path / "frontend.log").read_text()[-2000:]
            time.sleep(0.1)
        for _ in range(FD_LIMIT + 100):   # more than the process may open
            silent.append(socket.create_connection(("127.0.0.1", port)))
        deadline = time.monotonic() + 60
        while _http_health(port) not in (503, -1):   # refused once it has taken them in
            assert time.monotonic() < deadline, "served with every descriptor in use"
            time.sleep(0.2)
        for _ in range(5):   # new SDK connections: served, never an abort
            with Client(address, connect_timeout=10) as client:
                assert client.health()["ok"]
        assert proc.poll() is None, (tmp_path / "frontend.log").read_text()[-2000:]
        for sock in silent:
            sock.close()
        silent.clear()
        deadline = time.monotonic() + 30
        while _http_health(port) != 200:   # serving again once they are gone
            assert time.monotonic() < deadline
            time.sleep(0.2)
    finally:
        for sock in silent:
            sock.close()
        proc.terminate()
        proc.wait(timeout=30)


# ---- the API key and browsers --------------------------------------------------------------

def test_the_api_key_is_on_no_command_line(server):
    pids = [server.proc.pid, *_children(server.proc.pid)]
    assert len(pids) >= 4   # serve, scheduler, executor, frontend
    for pid in pids:
        assert KEY.encode() not in Path(f"/proc/{pid}/cmdline").read_bytes(), pid
    assert httpx.get(f"{server.base}/v1/models", headers=AUTH).status_code == 200
    assert httpx.get(f"{server.base}/v1/models").status_code == 401


def test_no_openapi_schema_and_no_text_plain_posts(server):
    for path in ("/openapi.json", "/docs", "/redoc"):
        assert httpx.get(f"{server.base}{path}").status_code == 404
    body = json.dumps({"prompt": "hi", "max_tokens": 2})
    refused = httpx.post(f"{server.base}/v1/completions", content=body,
                         headers={**AUTH, "Content-Type": "text/plain"})
    assert refused.status_code == 415
    assert refused.json()["error"]["code"] == "unsupported_media_type"
    assert refused.json()["error"]["type"] == "invalid_request_error"
    served = httpx.post(f"{server.base}/v1/completions", content=body,
                        headers={**AUTH, "Content-Type": "application/json"})
    assert served.status_code == 200


def test_a_foreign_host_header_is_refused_on_loopback(server):
    url = f"{server.base}/v1/models"
    rebound = httpx.get(url, headers={**AUTH, "Host": f"attacker.example:{server.port}"})
    assert rebound.status_code == 403
    assert rebound.json()["error"]["code"] == "host_not_allowed"
    for name in (f"localhost:{server.port}", "127.0.0.1", f"[::1]:{server.port}"):
        assert httpx.get(url, headers={**AUTH, "Host": name}).status_code == 200, name
