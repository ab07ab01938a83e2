"""Runs compose.yaml's services as local processes, the way a CI machine without a Docker
engine can: each service's own command and environment, service names resolved to 127.0.0.1.

- `${VAR:-default}` interpolation from a given mapping (the compose .env, in effect).
- The image's ENTRYPOINT ["folio"] becomes `python -m folio`.
- Every container port a service binds or another service connects to gets a free local
  port: `tcp://0.0.0.0:5556` in the scheduler and `tcp://scheduler:5556` elsewhere both
  become `tcp://127.0.0.1:<that port>`; so do `--port N`, `--host 0.0.0.0` and
  `http://127.0.0.1:N` in health checks.
- Mount targets become host paths: a bind mount's source, or one temporary directory per
  named volume, substituted wherever a command or variable names the container path.
- Services start in depends_on order; `service_completed_successfully` runs to its end.
"""

from __future__ import annotations

import os
import re
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import yaml

ROOT = Path(__file__).resolve().parent.parent
_VAR = re.compile(r"\$\$|\$\{([A-Za-z_][A-Za-z0-9_]*)(?:(:?-)([^}]*)|(:?\?)([^}]*))?\}")


def interpolate(value: Any, variables: dict[str, str]) -> Any:
    """Compose's variable syntax on every string of a loaded file."""
    if isinstance(value, dict):
        return {k: interpolate(v, variables) for k, v in value.items()}
    if isinstance(value, list):
        return [interpolate(v, variables) for v in value]
    if not isinstance(value, str):
        return value

    def one(match: re.Match) -> str:
        if match.group(0) == "$$":
            return "$"
        name, dash, default, question, message = match.groups()
        current = variables.get(name)
        if dash == ":-":
            return current if current else default
        if dash == "-":
            return default if current is None else current
        if question and (current is None or (question == ":?" and not current)):
            raise KeyError(f"{name}: {message}")
        return current or ""

    return _VAR.sub(one, value)


def load_compose(path: Path, variables: dict[str, str]) -> dict[str, Any]:
    return interpolate(yaml.safe_load(path.read_text()), variables)


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


class LocalCompose:
    def __init__(self, compose: dict[str, Any], work_dir: Path,
                 extra_env: dict[str, dict[str, str]] | None = None) -> None:
        self.compose = compose
        self.services: dict[str, dict[str, Any]] = compose["services"]
        self.work_dir = work_dir
        self.extra_env = extra_env or {}
        self.ports: dict[tuple[str, int], int] = {}
        self.volumes = {name: work_dir / f"volume-{name}"
                        for name in compose.get("volumes") or {}}
        for path in self.volumes.values():
            path.mkdir(parents=True, exist_ok=True)
        self.procs: dict[str, subprocess.Popen] = {}

    # ---- translation --------------------------------------------------------------------

    def port(self, service: str, container_port: int) -> int:
        """The local port standing for `service:container_port`."""
        key = (service, int(container_port))
        if key not in self.ports:
            self.ports[key] = free_port()
        return self.ports[key]

    def published(self, service: str) -> list[int]:
        """Container ports that `ports:` publishes for a service."""
        result = []
        for entry in self.services[service].get("ports") or []:
            text = str(entry["target"] if isinstance(entry, dict) else entry)
            result.append(int(text.rsplit(":", 1)[-1].split("/")[0]))
        return result

    def mounts(self, service: str) -> dict[str, Path]:
        """Container path -> host path for a service's volumes."""
        result = {}
        for entry in self.services[service].get("volumes") or []:
            if isinstance(entry, str):
                source, target = entry.split(":")[:2]
            else:
                source, target = entry["source"], entry["target"]
            if source in self.volumes:
                result[target] = self.volumes[source]
            else:
                result[target] = (ROOT / source).resolve()
        return result

    def _rewrite(self, service: str, text: str) -> str:
        def own(match: re.Match) -> str:
            return f"{match.group(1)}://127.0.0.1:{self.port(service, match.group(2))}"

        def other(match: re.Match) -> str:
            return f"tcp://127.0.0.1:{self.port(match.group(1), match.group(2))}"

        text = re.sub(r"(tcp|http)://(?:\*|0\.0\.0\.0|127\.0\.0\.1|localhost):(\d+)", own, text)
        names = "|".join(map(re.escape, self.services))
        text = re.sub(rf"tcp://({names}):(\d+)", other, text)
        for target, source in self.mounts(service).items():
            if text == target or text.startswith(target + "/"):
                text = str(source) + text[len(target):]
        return text

    def argv(self, service: str, args: list[str]) -> list[str]:
        out: list[str] = []
        for i, arg in enumerate(args):
            arg = self._rewrite(service, str(arg))
            if i and args[i - 1] == "--port":
                arg = str(self.port(service, int(arg)))
            elif i and args[i - 1] == "--host" and arg == "0.0.0.0":
                arg = "127.0.0.1"
            out.append(arg)
        if out and out[0] == "folio":
            out = [sys.executable, "-m", "folio", *out[1:]]
        return out

    def command(self, service: str) -> list[str]:
        return self.argv(service, ["folio", *self.services[service]["command"]])

    def environment(self, service: str) -> dict[str, str]:
        env = {k: v for k, v in os.environ.items() if not k.startswith("FOLIO_")}
        env.update(PYTHONPATH=str(ROOT), PYTHONUNBUFFERED="1")
        declared = self.services[service].get("environment") or {}
        if isinstance(declared, list):
            declared = dict(item.split("=", 1) for item in declared)
        for key, value in declared.items():
            if value is not None:
                env[key] = self._rewrite(service, str(value))
        env.update(self.extra_env.get(service, {}))
        return env

    def healthcheck(self, service: str) -> list[str] | None:
        test = (self.services[service].get("healthcheck") or {}).get("test")
        if not test or test[0] == "NONE":
            return None
        if test[0] == "CMD-SHELL":
            return ["sh", "-c", self._rewrite(service, test[1])]
        return self.argv(service, test[1:] if test[0] == "CMD" else test)

    # ---- running ------------------------------------------------------------------------

    def order(self) -> list[str]:
        done: list[str] = []

        def visit(name: str, path: tuple[str, ...]) -> None:
            if name in done:
                return
            if name in path:
                raise ValueError(f"depends_on cycle through {name}")
            for dep in self.services[name].get("depends_on") or {}:
                visit(dep, (*path, name))
            done.append(name)

        for name in self.services:
            visit(name, ())
        return done

    def start(self, service: str, env: dict[str, str] | None = None) -> subprocess.Popen:
        """Start (or restart) one service; `env` overrides its variables."""
        log = open(self.work_dir / f"{service}.log", "ab")
        proc = subprocess.Popen(self.command(service), cwd=self.work_dir,
                                env={**self.environment(service), **(env or {})}, stdout=log,
                                stderr=subprocess.STDOUT)
        log.close()
        self.procs[service] = proc
        return proc

    def up(self, timeout: float = 180.0) -> None:
        """Start everything in order; wait for one-shot services and every health check."""
        deadline = time.monotonic() + timeout
        for name in self.order():
            for dep, how in (self.services[name].get("depends_on") or {}).items():
                condition = how.get("condition") if isinstance(how, dict) else None
                if condition == "service_completed_successfully":
                    code = self.procs[dep].wait(timeout=max(1, deadline - time.monotonic()))
                    assert code == 0, f"{dep} exited {code}: {self.logs(dep)}"
                elif condition == "service_healthy":
                    self.wait_healthy(dep, deadline - time.monotonic())
            self.start(name)
        for name in self.services:
            if self.healthcheck(name):
                self.wait_healthy(name, deadline - time.monotonic())

    def probe(self, service: str, timeout: float = 10.0) -> subprocess.CompletedProcess:
        return subprocess.run(self.healthcheck(service), env=self.environment(service),
                              capture_output=True, text=True, timeout=timeout)

    def wait_healthy(self, service: str, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while True:
            proc = self.procs[service]
            if proc.poll() is not None:
                raise RuntimeError(f"{service} exited {proc.returncode}: {self.logs(service)}")
            if self.probe(service).returncode == 0:
                return
            if time.monotonic() > deadline:
                raise TimeoutError(f"{service} not healthy: {self.logs()}")
            time.sleep(0.3)

    def logs(self, service: str | None = None) -> str:
        paths = [self.work_dir / f"{service}.log"] if service else \
            sorted(self.work_dir.glob("*.log"))
        return "\n".join(f"--- {p.name}\n{p.read_text(errors='replace')[-3000:]}"
                         for p in paths if p.exists())

    def down(self, timeout: float = 20.0) -> dict[str, int]:
        """SIGTERM to whatever still runs, in reverse start order; the exit codes."""
        for name in reversed(self.order()):
            proc = self.procs.get(name)
            if proc is not None and proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
                try:
                    proc.wait(timeout=timeout)
                except subprocess.TimeoutExpired:
                    proc.kill()
                    proc.wait()
        return {name: proc.returncode for name, proc in self.procs.items()}
