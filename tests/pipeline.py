"""Starts the real processes on ipc:// sockets in a temporary directory, and stops them."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from folio.client import Client

ROOT = Path(__file__).resolve().parent.parent


def spawn_role(args: list[str], log: Path) -> subprocess.Popen:
    """`python -m folio ARGS` from the repository, its output appended to `log`."""
    env = dict(os.environ, PYTHONPATH=str(ROOT), PYTHONUNBUFFERED="1")
    handle = open(log, "ab")
    return subprocess.Popen([sys.executable, "-m", "folio", *args], cwd=ROOT, env=env,
                            stdout=handle, stderr=subprocess.STDOUT)


def process_logs(run_dir: Path, tail: int = 3000) -> str:
    return "\n".join(f"--- {p.name}\n{p.read_text(errors='replace')[-tail:]}"
                     for p in sorted(run_dir.glob("*.log")))


def stop_processes(procs) -> None:
    """SIGTERM to each, then wait; SIGKILL what is still there after 10 s."""
    for proc in procs:
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
    for proc in procs:
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


class Pipeline:
    """scheduler + executor + N frontends, each its own OS process."""

    def __init__(self, run_dir: Path, model_dir: Path, num_frontends: int = 1,
                 engine_args: tuple[str, ...] = (), scheduler_args: tuple[str, ...] = (),
                 http_port: int | None = None):
        """http_port: the first frontend also serves the OpenAI API (and chat page) there."""
        self.run_dir = run_dir
        self.model_dir = model_dir
        self.engine_args = engine_args
        self.http_port = http_port
        self.frontend_address = f"ipc://{run_dir}/sched-fe.sock"
        self.executor_address = f"ipc://{run_dir}/sched-ex.sock"
        self.client_addresses = [f"ipc://{run_dir}/client{i}.sock" for i in range(num_frontends)]
        self.procs: dict[str, subprocess.Popen] = {}
        self.procs["scheduler"] = spawn_role(
            ["scheduler", "--frontend-address", self.frontend_address,
             "--executor-address", self.executor_address, *scheduler_args],
            run_dir / "scheduler.log")
        self.start_executor()
        for i, address in enumerate(self.client_addresses):
            http = ["--port", str(http_port)] if http_port and i == 0 else []
            self.procs[f"frontend{i}"] = spawn_role(
                ["frontend", "--model", str(model_dir), "--client-address", address,
                 "--scheduler-address", self.frontend_address, *http],
                run_dir / f"frontend{i}.log")

    def start_executor(self) -> None:
        self.procs["executor"] = spawn_role(
            ["executor", "--model", str(self.model_dir), "--scheduler-address",
             self.executor_address, "--dtype", "float32", *self.engine_args],
            self.run_dir / "executor.log")

    def wait_ready(self, timeout: float = 120.0) -> None:
        deadline = time.monotonic() + timeout
        for address in self.client_addresses:
            client = Client(address, connect_timeout=1.0)
            try:
                while True:
                    self.check_alive()
                    try:
                        if client.health(timeout=1.0)["ok"]:
                            break
                    except Exception:   # still starting
                        pass
                    if time.monotonic() > deadline:
                        raise TimeoutError(f"pipeline not ready; logs: {self.logs()}")
                    time.sleep(0.3)
            finally:
                client.close()

    def check_alive(self) -> None:
        dead = {name: p.returncode for name, p in self.procs.items() if p.poll() is not None}
        if dead:
            raise RuntimeError(f"processes died: {dead}; logs: {self.logs()}")

    def logs(self) -> str:
        return process_logs(self.run_dir)

    def stop(self) -> None:
        stop_processes(self.procs.values())
