"""A frontend whose link to the scheduler drops resumes its requests exactly (issue 42).

The three roles run as their own processes; the frontend reaches the scheduler through a
TCP relay in this test, which the test cuts (every connection through it closed at once,
as a network blip between hosts would). Streams that were running carry on after the link
comes back, and each one's tokens are exactly the greedy continuation the same prompt gets
without any cut; nothing fails, and every block comes back.
"""

from __future__ import annotations

import asyncio
import json
import socket
import threading
import time
import urllib.request
from pathlib import Path

from folio import SamplingParams
from folio.client import AsyncClient, Delta, _prompt_fields
from tests.http_server import free_port
from tests.pipeline import process_logs, spawn_role, stop_processes

ENDLESS = 30_000   # tokens: still running when the cut lands, on any engine
PROMPTS = [[11 + i, 500 + 7 * i, 42, 9 + i] for i in range(3)]


class Relay:
    """TCP from a local port to `target`, every connection pumped by two threads; `cut`
    closes all the connections open now (new ones are accepted as before)."""

    def __init__(self, target: tuple[str, int]) -> None:
        self.target = target
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.port = self.listener.getsockname()[1]
        self.lock = threading.Lock()
        self.open: list[socket.socket] = []
        self.cuts = 0
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                inside, _ = self.listener.accept()
            except OSError:
                return
            try:
                outside = socket.create_connection(self.target)
            except OSError:   # the scheduler is not listening yet: the peer retries
                inside.close()
                continue
            with self.lock:
                self.open += [inside, outside]
            for src, dst in ((inside, outside), (outside, inside)):
                threading.Thread(target=self._pump, args=(src, dst), daemon=True).start()

    @staticmethod
    def _pump(src: socket.socket, dst: socket.socket) -> None:
        try:
            while data := src.recv(65536):
                dst.sendall(data)
        except OSError:
            pass
        for sock in (src, dst):
            try:
                sock.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass

    def cut(self) -> None:
        with self.lock:
            cut, self.open = self.open, []
            self.cuts += 1
        for sock in cut:
            try:
                sock.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
            sock.close()

    def close(self) -> None:
        self.listener.close()
        self.cut()


def _health(base: str) -> dict:
    try:
        with urllib.request.urlopen(f"{base}/health", timeout=2) as response:
            return json.load(response)
    except (OSError, ValueError):
        return {}


def _until(condition, what: str, logs, timeout: float = 120.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, f"{what}: {logs()}"
        time.sleep(0.05)


def test_a_dropped_frontend_link_resumes_every_stream_exactly(tmp_path: Path, long_llama_dir):
    scheduler_port = free_port()
    relay = Relay(("127.0.0.1", scheduler_port))
    http_port = free_port()
    base = f"http://127.0.0.1:{http_port}"
    client_address = f"ipc://{tmp_path}/client.sock"
    executor_address = f"ipc://{tmp_path}/executor.sock"
    procs = {
        "scheduler": spawn_role(["scheduler", "--frontend-address",
                                 f"tcp://127.0.0.1:{scheduler_port}", "--executor-address",
                                 executor_address], tmp_path / "scheduler.log"),
        "executor": spawn_role(["executor", "--model", str(long_llama_dir),
                                "--scheduler-address", executor_address, "--dtype", "float32",
                                "--num-kv-blocks", "2048", "--max-model-len", "32768",
                                "--cpu-threads", "1"], tmp_path / "executor.log"),
        "frontend": spawn_role(["frontend", "--model", str(long_llama_dir),
                                "--client-address", client_address, "--scheduler-address",
                                f"tcp://127.0.0.1:{relay.port}", "--port", str(http_port),
                                "--served-model-name", "x"], tmp_path / "frontend.log"),
    }
    logs = lambda: process_logs(tmp_path, 3000)   # noqa: E731
    greedy = dict(temperature=0, ignore_eos=True)

    async def run() -> tuple[list[list[int]], list[list[int]]]:
        async with AsyncClient(client_address) as client:
            streamed: list[list[int]] = [[] for _ in PROMPTS]
            ends: list[str | None] = [None] * len(PROMPTS)

            async def read(i: int) -> None:
                params = SamplingParams(max_tokens=ENDLESS, **greedy)
                async for item in client._run(_prompt_fields(PROMPTS[i]), params, f"r{i}",
                                              None, True):
                    if isinstance(item, Delta):
                        streamed[i] += item.token_ids
                    else:   # the final Completion
                        ends[i] = item.finish_reason
                        assert item.token_ids == streamed[i]

            readers = [asyncio.create_task(read(i)) for i in range(len(PROMPTS))]
            try:
                while not all(streamed):   # each one surely runs
                    assert not any(r.done() for r in readers), [r for r in readers if r.done()]
                    await asyncio.sleep(0.01)
                relay.cut()
                frontend_log = tmp_path / "frontend.log"
                await asyncio.to_thread(_until, lambda: "request(s) resumed" in
                                        frontend_log.read_text(), "no resume", logs)
                at_resume = [len(tokens) for tokens in streamed]
                while not all(len(t) > n for t, n in zip(streamed, at_resume)):
                    assert not any(r.done() for r in readers), logs()
                    await asyncio.sleep(0.01)   # streaming again after the resume
            finally:
                for i in range(len(PROMPTS)):
                    await client.abort(f"r{i}")
                results = await asyncio.gather(*readers, return_exceptions=True)
            assert not [r for r in results if isinstance(r, BaseException)], (results, logs())
            assert ends == ["abort"] * len(PROMPTS), ends
            reference = [(await client.generate(prompt, SamplingParams(
                max_tokens=len(tokens), **greedy))).token_ids
                for prompt, tokens in zip(PROMPTS, streamed)]
            deadline = time.monotonic() + 60
            while True:   # the aborts' answers may still be on their way
                stats = (await client.health())["stats"]
                if stats["num_running"] == stats["num_waiting"] == 0 and \
                        stats["kv_blocks_free"] == stats["kv_blocks_total"]:
                    break
                assert time.monotonic() < deadline, (stats, logs())
                await asyncio.sleep(0.05)
            return streamed, reference

    try:
        _until(lambda: _health(base).get("status") == "ok", "not serving", logs)
        streamed, reference = asyncio.run(run())
        assert streamed == reference
        scheduler_log = (tmp_path / "scheduler.log").read_text()
        assert "resumed 3 request(s)" in scheduler_log, scheduler_log[-3000:]
        assert "gave up on frontend" not in scheduler_log
    finally:
        relay.close()
        stop_processes(procs.values())
