"""Servers as the benches start, wait for and stop them: any server command on a free loopback
port, in a process group of its own (its children stop with it), ready once /health and
/v1/models answer (and every replica serves, where /health lists them); `folio serve` as the
common case; and the CPU seconds a server's children used."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _serving(base_url: str) -> bool:
    """/health and /v1/models answer 200, and every replica /health lists is ok."""
    with urllib.request.urlopen(f"{base_url}/health", timeout=2) as response:
        text = response.read()
    try:
        replicas = json.loads(text).get("replicas", [])
    except (ValueError, AttributeError):   # vLLM's /health has an empty body
        replicas = []
    if not all(r.get("status") == "ok" for r in replicas):
        return False
    with urllib.request.urlopen(f"{base_url}/v1/models", timeout=2):
        return True


class Server:
    """One server process and its children; the word PORT in `command` becomes a free
    loopback port. Its output goes to `log` (nowhere without one)."""

    def __init__(self, name: str, command: list[str], log: Path | None = None,
                 env: dict[str, str] | None = None, cwd: Path = ROOT) -> None:
        self.name, self.port, self.log = name, free_port(), log
        self.base_url = f"http://127.0.0.1:{self.port}"
        self.command = [str(self.port) if word == "PORT" else word for word in command]
        out = open(log, "wb") if log else subprocess.DEVNULL
        try:   # the child keeps its own copy of the descriptor
            self.proc = subprocess.Popen(
                self.command, cwd=cwd, env={**os.environ, "PYTHONUNBUFFERED": "1", **(env or {})},
                stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
        finally:
            if log:
                out.close()

    def wait_ready(self, timeout: float = 300, poll_s: float = 0.5) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                tail = self.log.read_text(errors="replace")[-3000:] if self.log else ""
                raise RuntimeError(f"{self.name} exited {self.proc.returncode}:\n{tail}")
            try:
                if _serving(self.base_url):
                    return
            except OSError:   # not listening yet, or still loading
                pass
            time.sleep(poll_s)
        self.stop()
        raise TimeoutError(f"{self.name} not ready after {timeout} s; log {self.log}")

    def stop(self, timeout: float = 60) -> None:
        """SIGTERM to the process group; SIGKILL what is left after `timeout`."""
        if self.proc.poll() is not None:
            return
        os.killpg(self.proc.pid, signal.SIGTERM)
        try:
            self.proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait()


def start(model: str | None, extra: list[str], env: dict[str, str] | None = None) -> Server:
    """`folio serve` (of `model`, or the built-in one) with `extra` flags, ready."""
    command = [sys.executable, "-m", "folio", "--log-level", "WARNING", "serve", "--port",
               "PORT", *extra, *(["--model", model] if model else [])]
    server = Server("folio serve", command, env={"PYTHONPATH": str(ROOT), **(env or {})})
    server.wait_ready()
    return server


def _cpu_s(fields: list[str]) -> float:
    """User plus system CPU seconds from /proc/PID/stat's fields after the command name."""
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def process_cpu_s(pid: int) -> float:
    """CPU seconds used so far by process `pid`."""
    return _cpu_s(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split())


def children_cpu_s(parent: int, name_prefix: str) -> float:
    """CPU seconds used so far by the children of `parent` whose name starts so."""
    total = 0.0
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue
        name = stat[stat.index("(") + 1:stat.rindex(")")]
        fields = stat[stat.rindex(")") + 2:].split()
        if name.startswith(name_prefix) and int(fields[1]) == parent:
            total += _cpu_s(fields)
    return total
