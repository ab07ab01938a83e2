"""`folio serve` as the benches start, stop and account for it: a free loopback port, a
server started and waited for (every replica serving), one SIGTERM stop, and the CPU seconds
its children used (bench/serve_variants.py, bench/nonreading_client.py)."""

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


def start(model: str | None, extra: list[str],
          env: dict[str, str] | None = None) -> tuple[subprocess.Popen, str]:
    """`folio serve` on a free loopback port, once /health says every replica serves."""
    port = free_port()
    cmd = [sys.executable, "-m", "folio", "--log-level", "WARNING", "serve", "--port",
           str(port), *extra]
    if model:
        cmd += ["--model", model]
    proc = subprocess.Popen(cmd, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                            env=dict(os.environ, PYTHONPATH=str(ROOT), **(env or {})))
    base = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise SystemExit(f"folio serve {' '.join(extra)} exited")
        try:
            with urllib.request.urlopen(f"{base}/health", timeout=1) as response:
                body = json.load(response)
            if all(r["status"] == "ok" for r in body.get("replicas", [{"status": "ok"}])):
                return proc, base
        except OSError:
            pass
        time.sleep(0.5)
    proc.kill()
    raise SystemExit("server not ready")


def stop(proc: subprocess.Popen, timeout: float = 60) -> None:
    proc.send_signal(signal.SIGTERM)
    try:
        proc.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


def children_cpu_s(parent: int, name_prefix: str) -> float:
    """CPU seconds used so far by the children of `parent` whose name starts so."""
    tick = os.sysconf("SC_CLK_TCK")
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
            total += (int(fields[11]) + int(fields[12])) / tick
    return total
