"""One machine as two hosts: two network namespaces joined by a veth pair (10.77.0.1/24 in
the first, 10.77.0.2/24 in the second), made for a test and removed after it, with every
process started in them. Needs root and `ip netns`; `two_hosts()` skips the test when the
machine does not permit them.

Client sockets on ipc:// paths reach into a namespace (a Unix socket's path is not bound to
a network namespace), so the test talks to a server in the first host from outside."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
ADDRESSES = ("10.77.0.1", "10.77.0.2")


@dataclass(frozen=True)
class Hosts:
    names: tuple[str, str]   # the namespaces
    links: tuple[str, str]   # each one's end of the veth pair

    def set_link(self, host: int, up: bool) -> None:
        """Unplug (or plug back) a host's cable: its peers see silence, no closed
        connection."""
        _ip("-n", self.names[host], "link", "set", self.links[host], "up" if up else "down")

    def spawn(self, host: int, args: list[str], log: Path) -> subprocess.Popen:
        """`python -m folio ARGS` in host 0 or 1, in a process group of its own (so a kill
        takes its children too), its output appended to `log`."""
        env = dict(os.environ, PYTHONPATH=str(ROOT), PYTHONUNBUFFERED="1")
        return subprocess.Popen(["ip", "netns", "exec", self.names[host], sys.executable,
                                 "-m", "folio", *args], cwd=ROOT, env=env,
                                stdout=open(log, "ab"), stderr=subprocess.STDOUT,
                                start_new_session=True)


def _ip(*args: str) -> None:
    subprocess.run(["ip", *args], check=True, capture_output=True, text=True, timeout=30)


@contextmanager
def two_hosts() -> Iterator[Hosts]:
    if os.geteuid() != 0 or shutil.which("ip") is None:
        pytest.skip("two network namespaces need root and iproute2's `ip`")
    tag = f"{os.getpid() % 100000}"
    names = (f"folio-tp-a{tag}", f"folio-tp-b{tag}")
    links = (f"ftpa{tag}", f"ftpb{tag}")   # at most 15 characters
    made: list[str] = []
    try:
        for name in names:
            try:
                _ip("netns", "add", name)
            except subprocess.CalledProcessError as error:
                pytest.skip(f"`ip netns add` is not permitted here: {error.stderr.strip()}")
            made.append(name)
        _ip("link", "add", links[0], "type", "veth", "peer", "name", links[1])
        for name, link, address in zip(names, links, ADDRESSES):
            _ip("link", "set", link, "netns", name)
            _ip("-n", name, "addr", "add", f"{address}/24", "dev", link)
            _ip("-n", name, "link", "set", link, "up")
            _ip("-n", name, "link", "set", "lo", "up")
        yield Hosts(names, links)
    finally:
        for name in made:   # the veth pair goes with its namespaces
            _kill_all_in(name)
            subprocess.run(["ip", "netns", "del", name], capture_output=True, timeout=30, check=False)
        if not made:
            subprocess.run(["ip", "link", "del", links[0]], capture_output=True, timeout=30, check=False)


def _kill_all_in(name: str) -> None:
    out = subprocess.run(["ip", "netns", "pids", name], capture_output=True, text=True,
                         timeout=30, check=False).stdout
    for pid in map(int, out.split()):
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
