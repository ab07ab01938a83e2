"""compose.yaml's services as local processes (no Docker engine on CI): TCP and CURVE between
them, health checks, a chat over HTTP and over the SDK, key-less peers refused on every
socket, an executor killed and restarted, and the SIGTERM drain.

The tests share one deployment and run in file order; the last two stop it.
"""

from __future__ import annotations

import asyncio
import json
import signal
import threading
import time

import httpx
import pytest
import zmq

from folio import SamplingParams
from folio.client import AsyncClient, Client
from folio.errors import EngineDead, ServerUnreachable, ShuttingDown
from folio.probe import _scheduler_stats
from folio.shared.protocol import messages as m
from folio.shared.config import ExecutorCapacity
from folio.shared.security import load_keys, make_client
from tests.compose_local import ROOT, LocalCompose, load_compose
from tests.pipeline import start_streams

pytestmark = pytest.mark.slow
KV_BLOCKS = 2048   # 32768 tokens: one answer as long as the model's context
ENDLESS = 30_000   # tokens: outlasts any step of a test on a far faster engine


@pytest.fixture(scope="module")
def deployment(tmp_path_factory, long_llama_dir):
    work = tmp_path_factory.mktemp("compose")
    variables = {"FOLIO_MODEL_DIR": str(long_llama_dir),
                 "FOLIO_NUM_KV_BLOCKS": str(KV_BLOCKS)}
    local = LocalCompose(load_compose(ROOT / "compose.yaml", variables), work)
    try:
        local.up()
        yield local
    finally:
        local.down()


def _http(deployment: LocalCompose) -> str:
    return f"http://127.0.0.1:{deployment.port('frontend', 8000)}"


def _zmq(deployment: LocalCompose, service: str = "frontend", port: int = 5555) -> str:
    return f"tcp://127.0.0.1:{deployment.port(service, port)}"


def _keys(deployment: LocalCompose) -> str:
    return str(deployment.volumes["keys"])


def _stats(deployment: LocalCompose) -> dict:
    stats = _scheduler_stats(_zmq(deployment, "scheduler", 5556), 3.0, _keys(deployment))
    assert stats is not None, deployment.logs()
    return stats


def _wait_idle(deployment: LocalCompose, timeout: float = 60.0) -> dict:
    deadline = time.monotonic() + timeout
    while True:
        stats = _stats(deployment)
        idle = stats.get("num_running", 0) == 0 and stats.get("num_waiting", 0) == 0
        if idle and stats.get("kv_blocks_free") == stats.get("kv_blocks_total"):
            return stats
        if time.monotonic() > deadline:
            return stats
        time.sleep(0.1)


def _chat(base: str, max_tokens: int = 8) -> httpx.Response:
    return httpx.post(f"{base}/v1/chat/completions", timeout=30, json={
        "messages": [{"role": "user", "content": "What is a list?"}],
        "max_tokens": max_tokens, "temperature": 0})


def test_services_are_healthy_and_serve_http_and_sdk_over_curve(deployment):
    # Only the frontend publishes ports: 8000 (HTTP) and 5555 (ZeroMQ).
    assert deployment.published("frontend") == [8000, 5555]
    assert all(not deployment.published(s) for s in ("scheduler", "executor", "keys"))
    for service in ("scheduler", "executor", "frontend"):
        result = deployment.probe(service)
        assert result.returncode == 0 and "healthy" in result.stdout, result
    assert oct(deployment.volumes["keys"].stat().st_mode & 0o777) == "0o700"

    response = _chat(_http(deployment))
    assert response.status_code == 200, response.text
    body = response.json()
    assert body["object"] == "chat.completion" and body["usage"]["completion_tokens"] == 8

    with Client(_zmq(deployment), curve_keys=_keys(deployment)) as client:
        reply = client.chat([{"role": "user", "content": "What is a list?"}],
                            SamplingParams(max_tokens=6, temperature=0))
        assert reply.usage.completion_tokens == 6 and reply.finish_reason == "length"
        assert client.health()["ok"]
    # The same client port without keys: the handshake is refused, with a clear error. The
    # explicit refusal ends the wait at once; under load the first tries may only see the
    # connection reset, so the wait is generous (a loaded machine gave 1.5 s no explicit one).
    with Client(_zmq(deployment), connect_timeout=60) as plain:
        with pytest.raises(ServerUnreachable, match="wants CURVE keys"):
            plain.generate("hello", SamplingParams(max_tokens=2))


def _rogue_messages() -> dict[tuple[str, int], list[bytes]]:
    """Valid messages for each socket: each would do something if it were let in."""
    capacity = ExecutorCapacity(num_kv_blocks=7, block_size=16, max_model_len=64,
                                vocab_size=1024, eos_token_ids=(1,))
    return {
        ("scheduler", 5556): [m.pack("frontend_hello", {"id": "rogue"}),
                              m.encode_add("rogue-1", [5, 6, 7], SamplingParams(max_tokens=4)),
                              m.pack("stats_request", {})],
        ("scheduler", 5557): [m.encode_hello_executor(capacity, 4242),
                              m.encode_heartbeat(4242)],
        ("frontend", 5555): [m.encode_generate("rogue-2", SamplingParams(max_tokens=4), False,
                                               prompt="hello"),
                             m.pack("health", {"id": "rogue-3"})],
    }


def test_peers_without_the_keys_get_nothing_in_and_nothing_out(deployment):
    keys = load_keys(_keys(deployment))
    before = _wait_idle(deployment)
    ctx = zmq.Context()
    sockets: list[tuple[str, zmq.Socket]] = []
    try:
        for (service, port), messages in _rogue_messages().items():
            address = _zmq(deployment, service, port)
            stranger_public, stranger_secret = zmq.curve_keypair()
            fake_server, _ = zmq.curve_keypair()
            # An SDK user's key opens the frontend's client port, never a scheduler socket.
            sdk_key = ("SDK user's key",) if service == "scheduler" else ()
            for kind in ("no CURVE", "unlisted client key", "wrong server key", *sdk_key):
                sock = ctx.socket(zmq.DEALER)
                sock.setsockopt(zmq.LINGER, 0)
                if kind == "SDK user's key":
                    make_client(sock, keys.server_public, keys.client_public, keys.client_secret)
                elif kind == "unlisted client key":
                    make_client(sock, keys.server_public, stranger_public, stranger_secret)
                elif kind == "wrong server key":
                    make_client(sock, fake_server, keys.client_public, keys.client_secret)
                sock.connect(address)
                for message in messages:
                    sock.send(message)
                sockets.append((f"{service}:{port} {kind}", sock))
        # Control: the right keys on the same socket (the frontends' own: that socket
        # admits no SDK user's key) get an answer to the same request.
        frontend_keys = load_keys(_keys(deployment), peer="frontend")
        control = make_client(ctx.socket(zmq.DEALER), keys.server_public,
                              frontend_keys.client_public, frontend_keys.client_secret)
        control.setsockopt(zmq.LINGER, 0)
        control.connect(_zmq(deployment, "scheduler", 5556))
        control.send(m.pack("stats_request", {}))
        assert control.poll(30_000), "the control request got no answer"   # loaded: slow
        control.close(0)
        time.sleep(1.0)
        answered = [name for name, sock in sockets if sock.poll(0)]
        assert answered == [], f"peers without the keys got replies: {answered}"
    finally:
        for _, sock in sockets:
            sock.close(0)
        ctx.term()
    after = _wait_idle(deployment)
    # Nothing was scheduled, no executor was swapped in, no frontend was registered.
    for key in ("steps", "num_finished", "kv_blocks_total", "num_frontends"):
        assert after[key] == before[key], (key, before, after)
    assert after["executor_alive"] and after["kv_blocks_total"] == KV_BLOCKS
    logs = deployment.logs("scheduler")
    assert "rogue" not in logs and "4242" not in logs


def test_executor_killed_and_restarted_over_tcp_and_curve(deployment):
    address, keys = _zmq(deployment), _keys(deployment)

    async def run():
        async with AsyncClient(address, curve_keys=keys) as client:
            # Each has streamed a token, so it runs, when the executor dies.
            jobs = await start_streams(client, [7] * 20, SamplingParams(
                max_tokens=ENDLESS, ignore_eos=True), count=4)
            deployment.procs["executor"].send_signal(signal.SIGKILL)
            return await asyncio.wait_for(asyncio.gather(*jobs, return_exceptions=True), 60)

    try:
        results = asyncio.run(run())
        assert all(isinstance(r, EngineDead) for r in results), results
        assert "executor" in str(results[0])
        deployment.procs["executor"].wait(timeout=30)
        assert deployment.probe("executor").returncode == 1   # nothing attached now
        with Client(address, curve_keys=keys) as client:
            assert not client.health()["ok"]
            with pytest.raises(EngineDead):
                client.generate([1, 2], SamplingParams(max_tokens=2))
    finally:   # what `restart: unless-stopped` does; the tests after this one need it
        if deployment.procs["executor"].poll() is None:
            deployment.procs["executor"].kill()
            deployment.procs["executor"].wait(timeout=30)
        deployment.start("executor")
        deployment.wait_healthy("executor", 120)
        deployment.wait_healthy("frontend", 60)
    with Client(address, curve_keys=keys) as client:
        assert len(client.generate([1, 2], SamplingParams(max_tokens=3)).token_ids) == 3
    stats = _wait_idle(deployment)
    assert stats["kv_blocks_free"] == stats["kv_blocks_total"] == KV_BLOCKS
    assert stats["kv_blocks_used"] == 0


def _chat_stream(base: str, max_tokens: int, result: dict, first_token: threading.Event,
                 leave: threading.Event | None = None) -> None:
    """A streamed chat read to its end (or until `leave` is set: the client goes, so the
    request is aborted); `first_token` is set at its first token."""
    text, finish = [], None
    with httpx.stream("POST", f"{base}/v1/chat/completions", timeout=300, json={
            "messages": [{"role": "user", "content": "Tell me about tuples."}],
            "max_tokens": max_tokens, "ignore_eos": True, "stream": True}) as response:
        result["status"] = response.status_code
        for line in response.iter_lines():
            if leave is not None and leave.is_set():
                return
            if line.startswith("data: {"):
                choice = json.loads(line[6:])["choices"]
                if choice:
                    text.append(choice[0]["delta"].get("content") or "")
                    finish = choice[0]["finish_reason"] or finish
                    if text[-1]:
                        first_token.set()
            elif line == "data: [DONE]":
                result["done"] = True
    result["text"], result["finish"] = "".join(text), finish


def test_sigterm_drains_the_frontend_then_every_process_exits_0(deployment):
    base, frontend = _http(deployment), deployment.procs["frontend"]
    # `holder` runs until the test lets its client go, so the frontend surely drains while
    # the test looks; `result` is a running stream that must end normally meanwhile.
    held, result, leave = {}, {}, threading.Event()
    holder_runs, reader_runs = threading.Event(), threading.Event()
    holder = threading.Thread(target=_chat_stream,
                              args=(base, ENDLESS, held, holder_runs, leave))
    reader = threading.Thread(target=_chat_stream, args=(base, 1000, result, reader_runs))
    holder.start()
    try:
        assert holder_runs.wait(60), deployment.logs("frontend")
        reader.start()
        assert reader_runs.wait(60), deployment.logs("frontend")
        frontend.send_signal(signal.SIGTERM)
        deadline = time.monotonic() + 30
        while (health := httpx.get(f"{base}/health", timeout=5)).status_code == 200:
            assert time.monotonic() < deadline, "the frontend did not start draining"
            time.sleep(0.02)
        assert health.status_code == 503 and health.json()["status"] == "draining"
        refused = _chat(base)
        assert refused.status_code == 503, refused.text
        assert refused.headers["retry-after"] == "1"
        assert refused.json()["error"]["code"] == "shutting_down"
        with Client(_zmq(deployment), curve_keys=_keys(deployment)) as client:
            with pytest.raises(ShuttingDown, match="shutting down"):
                client.generate("hello", SamplingParams(max_tokens=2))
        assert frontend.poll() is None, "the frontend left while a request was running"
    finally:
        leave.set()   # the holder's client goes: its request is aborted
        holder.join(60)
        if reader.ident is not None:
            reader.join(300)
    assert held.get("status") == 200, held
    assert result.get("status") == 200 and result.get("done"), result
    assert result["finish"] == "length"
    assert frontend.wait(timeout=60) == 0, deployment.logs("frontend")


def test_shutdown_timeout_aborts_what_is_left(deployment):
    previous = deployment.procs["frontend"]
    if previous.poll() is None:   # this test run on its own
        previous.send_signal(signal.SIGTERM)
        previous.wait(timeout=40)
    frontend = deployment.start("frontend", {"FOLIO_SHUTDOWN_TIMEOUT": "0.5"})
    deployment.wait_healthy("frontend", 60)

    async def run():
        async with AsyncClient(_zmq(deployment), curve_keys=_keys(deployment)) as client:
            # Far longer than the 0.5 s the drain gives it, on any engine.
            stream = client.stream([3] * 10, SamplingParams(max_tokens=ENDLESS,
                                                            ignore_eos=True))
            await stream.__anext__()   # running: now stop the frontend
            frontend.send_signal(signal.SIGTERM)
            while not (await client.health())["draining"]:
                await asyncio.sleep(0.02)
            try:
                late = await client.generate("x", SamplingParams(max_tokens=2))
            except ShuttingDown as error:
                late = error
            try:
                async for _ in stream:
                    pass
            except ShuttingDown as error:
                return str(error), late
            return "finished", late

    started = time.monotonic()
    message, late = asyncio.run(asyncio.wait_for(run(), 60))
    assert "aborted" in message, message
    assert isinstance(late, ShuttingDown)
    assert frontend.wait(timeout=30) == 0
    assert time.monotonic() - started < 20   # the 0.5 s timeout, not the default 30 s
    stats = _wait_idle(deployment)   # the aborted request gave its blocks back
    assert stats["kv_blocks_free"] == stats["kv_blocks_total"]
    codes = deployment.down()
    assert codes == {"keys": 0, "scheduler": 0, "executor": 0, "frontend": 0}, \
        deployment.logs()
