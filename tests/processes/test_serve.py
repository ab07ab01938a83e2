"""`folio serve`: three named processes, a request through the SDK, clean stop."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from folio import SamplingParams
from folio.client import Client
from folio.errors import ServerUnreachable
from folio.placement import executor_runs_on_cpu, plan_placement
from folio.shared.cpus import usable_cores
from tests.http_server import free_port

pytestmark = pytest.mark.slow
ROOT = Path(__file__).resolve().parents[2]


def _children(pid: int) -> list[int]:
    out = subprocess.run(["ps", "-o", "pid=", "--ppid", str(pid)], capture_output=True,
                         text=True).stdout
    return [int(x) for x in out.split()]


def _comm(pid: int) -> str:
    return Path(f"/proc/{pid}/comm").read_text().strip()


def _gone(pid: int) -> bool:
    try:
        return _comm(pid) == ""
    except OSError:   # no such process (any more)
        return True


def test_serve_starts_three_processes_and_stops_cleanly(llama_dir, tmp_path):
    address = f"ipc://{tmp_path}/client.sock"
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    proc = subprocess.Popen([sys.executable, "-m", "folio", "serve", "--model", str(llama_dir),
                             "--zmq-address", address, "--num-kv-blocks", "128",
                             "--port", str(free_port())],
                            cwd=ROOT, env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True)
    lines: list[str] = []
    try:
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            line = proc.stdout.readline()
            if not line:
                break
            lines.append(line)
            if "clients connect to:" in line:
                break
        assert any(address in line for line in lines), "".join(lines)
        assert any(line.startswith(f"Folio is serving {llama_dir.name} (model ")
                   for line in lines), "".join(lines)
        run_dir = next(line.split(":", 1)[1].strip() for line in
                       iter(proc.stdout.readline, "") if "run directory" in line)
        children = _children(proc.pid)
        assert sorted(_comm(pid) for pid in children) == [
            "folio-executor", "folio-frontend", "folio-scheduler"]
        placement = plan_placement("auto", usable_cores(), executor_runs_on_cpu("auto"))
        for pid in children:
            role = _comm(pid).removeprefix("folio-")
            wanted = placement.cores_for(role)
            assert os.sched_getaffinity(pid) == set(wanted or usable_cores()), role
        with Client(address) as client:
            result = client.generate("The for statement", SamplingParams(max_tokens=5))
            assert len(result.token_ids) == 5 and result.finish_reason == "length"
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=20) == 0
        deadline = time.monotonic() + 30   # until the exited children are reaped
        for pid in children:
            while not _gone(pid):
                assert time.monotonic() < deadline, f"orphan {pid}"
                time.sleep(0.05)
        assert not Path(run_dir).exists()
        assert not Path(f"{tmp_path}/client.sock").exists()
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


@pytest.mark.parametrize("flags, name", [([], "folio-default"),
                                         (["--served-model-name", "a", "b"], "a")])
def test_banner_names_the_served_model(flags, name, tmp_path, monkeypatch):
    """The name clients ask for comes first: the built-in model's own, or the first given."""
    from folio.checks import check_serve
    from folio.cli import build_parser
    from folio.serve import Supervisor

    monkeypatch.setenv("TMPDIR", str(tmp_path))
    supervisor = Supervisor(check_serve(build_parser().parse_args(
        ["serve", "--port", "0", *flags])))
    try:
        first = supervisor.banner().splitlines()[0]
        assert first == f"Folio is serving {name} (model {supervisor.model})"
    finally:
        supervisor.stop_all()


def test_unreachable_server_is_a_clear_error(tmp_path):
    with Client(f"ipc://{tmp_path}/nobody.sock", connect_timeout=0.5) as client:
        with pytest.raises(ServerUnreachable, match=r"no Folio server answered at ipc://"):
            client.generate("hello")
