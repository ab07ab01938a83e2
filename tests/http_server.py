"""Starts `folio serve` with the HTTP API on a free port, for API tests."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


class HttpServer:
    def __init__(self, model_dir: Path, run_dir: Path, *extra: str) -> None:
        self.port = free_port()
        self.base = f"http://127.0.0.1:{self.port}"
        self.zmq_address = f"ipc://{run_dir}/client.sock"
        self.log = run_dir / "serve.log"
        env = dict(os.environ, PYTHONPATH=str(ROOT), PYTHONUNBUFFERED="1")
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "folio", "serve", "--model", str(model_dir),
             "--port", str(self.port), "--zmq-address", self.zmq_address, *extra],
            cwd=ROOT, env=env, stdout=open(self.log, "wb"), stderr=subprocess.STDOUT)

    def wait_ready(self, timeout: float = 120.0) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"folio serve exited: {self.log.read_text()[-3000:]}")
            try:
                with urllib.request.urlopen(f"{self.base}/health", timeout=1) as response:
                    if response.status == 200:
                        return
            except OSError:
                pass
            time.sleep(0.1)   # a cheap poll: readiness is observed, not waited out
        raise TimeoutError(f"not ready: {self.log.read_text()[-3000:]}")

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


@contextmanager
def serving(model_dir: Path, run_dir: Path, *extra: str) -> Iterator[HttpServer]:
    """A ready `folio serve` for the block, stopped after it (a module fixture's body)."""
    server = HttpServer(model_dir, run_dir, *extra)
    try:
        server.wait_ready()
        yield server
    finally:
        server.stop()


def openai_client(server: HttpServer, api_key: str):
    import openai

    return openai.OpenAI(base_url=f"{server.base}/v1", api_key=api_key, max_retries=0)


@contextmanager
def uvicorn_in_thread(app, gate, head_s: float, body_s: float) -> Iterator[int]:
    """The frontend's uvicorn settings (`http_config`, the ones `serve_http` uses) serving
    `app` in a thread of this process, on a free port: yields the port."""
    import asyncio
    import threading

    from folio.frontend.http.server import _Server, http_config

    port = free_port()
    srv = _Server(http_config(app, "127.0.0.1", port, gate, head_s, body_s))
    thread = threading.Thread(target=asyncio.run, args=(srv.serve(),), daemon=True)
    thread.start()
    try:
        deadline = time.monotonic() + 30
        while not srv.started:
            assert time.monotonic() < deadline, "the server did not start"
            time.sleep(0.02)
        yield port
    finally:
        srv.should_exit = True
        thread.join(timeout=5)


def with_chat_template(model_dir: Path, out: Path, template: str) -> Path:
    """A copy of `model_dir` at `out` whose tokenizer uses `template` as its chat template."""
    import json
    import shutil

    shutil.copytree(model_dir, out, dirs_exist_ok=True)
    (out / "chat_template.jinja").write_text(template)
    config = json.loads((out / "tokenizer_config.json").read_text())
    config.pop("chat_template", None)
    (out / "tokenizer_config.json").write_text(json.dumps(config))
    return out
