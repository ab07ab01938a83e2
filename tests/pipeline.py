"""Starts the real processes on ipc:// sockets in a temporary directory, and stops them."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from folio.client import AsyncClient, Client, Delta, _prompt_fields

ROOT = Path(__file__).resolve().parent.parent


async def start_streams(client: AsyncClient, prompt, params, count: int = 1,
                        request_ids: list[str] | None = None,
                        timeout: float = 60.0) -> list[asyncio.Task]:
    """`count` SDK calls of `prompt`, each read to its end by a task of its own (the final
    Completion, or what the SDK raises), returned once every one has streamed a token: each
    surely runs then. A test that needs work in flight starts it so (with a `max_tokens`
    that outlasts the next step of the test on a far faster engine), never with a sleep."""
    started = [asyncio.Event() for _ in range(count)]

    async def read(event: asyncio.Event, request_id: str | None):
        final = None
        async for item in client._run(_prompt_fields(prompt), params, request_id, None, True):
            if isinstance(item, Delta) and item.token_ids:
                event.set()
            final = item
        return final

    ids = request_ids or [None] * count
    tasks = [asyncio.create_task(read(event, ids[i])) for i, event in enumerate(started)]
    deadline = asyncio.get_running_loop().time() + timeout
    try:
        while not all(event.is_set() for event in started):
            ended = [task for task in tasks if task.done()]
            assert not ended, f"a request ended before it streamed a token: {ended[0]!r}"
            assert asyncio.get_running_loop().time() < deadline, \
                f"no token within {timeout:g} s"
            await asyncio.sleep(0.01)   # the events latch: this look cannot miss one
    except BaseException:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        raise
    return tasks


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
                 http_port: int | None = None, http_args: tuple[str, ...] = ()):
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
            http = ["--port", str(http_port), *http_args] if http_port and i == 0 else []
            self.procs[f"frontend{i}"] = spawn_role(
                ["frontend", "--model", str(model_dir), "--client-address", address,
                 "--scheduler-address", self.frontend_address, *http],
                run_dir / f"frontend{i}.log")

    def start_executor(self) -> None:
        self.procs["executor"] = spawn_role(
            ["executor", "--model", str(self.model_dir), "--scheduler-address",
             self.executor_address, "--dtype", "float32", *self.engine_args],
            self.run_dir / "executor.log")

    def restore_executor(self) -> None:
        """What a test that kills or stops a shared fixture's executor runs in its `finally`:
        continue it, or start a new one if it is gone; then wait until every frontend is
        ready, so the tests after it find the pipeline serving."""
        executor = self.procs["executor"]
        if executor.poll() is None:
            os.kill(executor.pid, signal.SIGCONT)
        else:
            self.start_executor()
        self.wait_ready()

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
                    time.sleep(0.1)
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
