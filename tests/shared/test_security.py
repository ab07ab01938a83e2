"""CURVE keys (`folio keys`), the ZAP allow-list, and settings from FOLIO_* variables."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

import pytest
import zmq

from folio.cli import build_parser
from folio.client import AsyncClient
from folio.shared.security import (generate_keys, load_keys, make_client, make_peer, make_server,
                             start_authenticator, stop_authenticator)
from folio.shared.transport import configure

ROOT = Path(__file__).resolve().parents[2]


def test_folio_keys_writes_private_keypairs_and_keeps_them(tmp_path):
    keys = tmp_path / "keys"
    run = [sys.executable, "-m", "folio", "keys", "--dir", str(keys)]
    out = subprocess.run(run, capture_output=True, text=True, cwd=ROOT, timeout=60)
    assert out.returncode == 0, out.stderr
    assert (keys.stat().st_mode & 0o777) == 0o700
    for name in ("server.key_secret", "client.key_secret"):
        assert ((keys / name).stat().st_mode & 0o777) == 0o600
    assert (keys / "authorized_clients" / "client.key").exists()
    assert not (keys / "authorized_clients" / "server.key").exists()
    before = (keys / "server.key_secret").read_bytes()
    again = subprocess.run(run + ["--client", "alice"], capture_output=True, text=True,
                           cwd=ROOT, timeout=60)
    assert again.returncode == 0 and "(kept)" not in again.stdout
    assert (keys / "server.key_secret").read_bytes() == before   # kept, not replaced
    assert (keys / "authorized_clients" / "alice.key").exists()
    generate_keys(keys, force=True)
    assert (keys / "server.key_secret").read_bytes() != before


def test_missing_keys_are_a_clear_error(tmp_path):
    with pytest.raises(FileNotFoundError, match="folio keys --dir"):
        load_keys(tmp_path / "nowhere")
    generate_keys(tmp_path / "k")
    (tmp_path / "k" / "client.key_secret").unlink()
    with pytest.raises(FileNotFoundError, match="client.key_secret"):
        load_keys(tmp_path / "k")
    assert load_keys(tmp_path / "k", server=True, client=False).server_secret


@pytest.mark.parametrize("transport", ["tcp", "ipc"])
def test_only_listed_client_keys_get_through(tmp_path, transport):
    generate_keys(tmp_path / "keys", extra_clients=("alice",))
    server_keys = load_keys(tmp_path / "keys", server=True, client=False)
    client_keys = load_keys(tmp_path / "keys")
    alice_public, alice_secret = zmq.auth.load_certificate(tmp_path / "keys" /
                                                           "alice.key_secret")
    ctx = zmq.Context()
    auth = start_authenticator(ctx, server_keys)
    server = make_server(configure(ctx.socket(zmq.ROUTER)), server_keys)
    address = "tcp://127.0.0.1:0" if transport == "tcp" else f"ipc://{tmp_path}/s.sock"
    server.bind(address)
    address = server.last_endpoint.decode()
    stranger = zmq.curve_keypair()
    peers = {
        "no curve": lambda s: s,
        "unlisted": lambda s: make_client(s, server_keys.server_public, *stranger),
        "wrong server": lambda s: make_client(s, stranger[0], client_keys.client_public,
                                              client_keys.client_secret),
        "client": lambda s: make_peer(s, client_keys),
        "alice": lambda s: make_client(s, server_keys.server_public, alice_public,
                                       alice_secret),
    }
    sockets = []
    try:
        for name, secure in peers.items():
            sock = secure(configure(ctx.socket(zmq.DEALER)))
            sock.connect(address)
            sock.send(name.encode())
            sockets.append(sock)
        got, deadline = set(), time.monotonic() + 30   # ends at the two answers
        while time.monotonic() < deadline and len(got) < 2:
            if server.poll(100):
                got.add(server.recv_multipart()[1].decode())
        time.sleep(0.3)
        while server.poll(0):
            got.add(server.recv_multipart()[1].decode())
        assert got == {"client", "alice"}
    finally:
        for sock in sockets:
            sock.close(0)
        server.close(0)
        stop_authenticator(auth)
        ctx.term()


def test_settings_come_from_folio_variables(monkeypatch):
    monkeypatch.setenv("FOLIO_CURVE_KEYS", "/keys")
    monkeypatch.setenv("FOLIO_SCHEDULER_ADDRESS", "tcp://scheduler:5556")   # required flag
    monkeypatch.setenv("FOLIO_CLIENT_CURVE", "0")
    monkeypatch.setenv("FOLIO_SHUTDOWN_TIMEOUT", "7.5")
    monkeypatch.setenv("FOLIO_PORT", "")   # empty: unset
    args = build_parser().parse_args(["frontend", "--client-address", "tcp://127.0.0.1:5555"])
    assert (args.curve_keys, args.scheduler_address, args.client_curve,
            args.shutdown_timeout_s, args.port) == ("/keys", "tcp://scheduler:5556", False, 7.5,
                                                  None)
    flagged = build_parser().parse_args(["frontend", "--client-address", "x",
                                         "--curve-keys", "/other", "--client-curve"])
    assert flagged.curve_keys == "/other" and flagged.client_curve   # the command line wins
    monkeypatch.setenv("FOLIO_NUM_KV_BLOCKS", "lots")
    monkeypatch.setenv("FOLIO_DTYPE", "float64")
    out = subprocess.run([sys.executable, "-m", "folio", "executor", "--scheduler-address",
                          "x"], capture_output=True, text=True, cwd=ROOT, timeout=60)
    assert out.returncode == 2 and "FOLIO_" in out.stderr


def test_client_curve_arguments_are_checked(tmp_path):
    generate_keys(tmp_path)
    with pytest.raises(ValueError, match="not both"):
        AsyncClient("tcp://127.0.0.1:1", curve_keys=str(tmp_path),
                    server_public_key="x" * 40)
    with pytest.raises(ValueError, match="40 Z85"):
        AsyncClient("tcp://127.0.0.1:1", server_public_key="short")
    with pytest.raises(ValueError, match="needs server_public_key"):
        AsyncClient("tcp://127.0.0.1:1", client_keys=zmq.curve_keypair())


def test_each_scheduler_socket_admits_only_its_own_peers_keys(tmp_path):
    """One allow-list per socket: an SDK user's key (alice) or the SDK's default key opens
    neither of the scheduler's sockets, a frontend's key opens only the frontend socket,
    and only the executor's key the executor socket (a real SchedulerService)."""
    from folio.scheduler.service import SchedulerService, SchedulerServiceConfig
    from folio.shared.security import EXECUTOR, FRONTEND

    keys = tmp_path / "keys"
    generate_keys(keys, extra_clients=("alice",))
    service = SchedulerService(SchedulerServiceConfig(
        frontend_address="tcp://127.0.0.1:0", executor_address="tcp://127.0.0.1:0",
        curve_keys=str(keys)))
    addresses = {"frontend": service.frontend_sock.last_endpoint.decode(),
                 "executor": service.executor_sock.last_endpoint.decode()}
    ctx = zmq.Context()
    outcome = {}
    try:
        for socket_name, address in addresses.items():
            for peer in ("alice", "client", FRONTEND, EXECUTOR):
                public, secret = zmq.auth.load_certificate(keys / f"{peer}.key_secret")
                sock = make_client(configure(ctx.socket(zmq.DEALER)),
                                   load_keys(keys, client=False).server_public, public, secret)
                monitor = sock.get_monitor_socket(zmq.EVENT_HANDSHAKE_SUCCEEDED
                                                  | zmq.EVENT_HANDSHAKE_FAILED_AUTH)
                sock.connect(address)
                assert monitor.poll(5000), (socket_name, peer)
                event = zmq.utils.monitor.recv_monitor_message(monitor)["event"]
                outcome[socket_name, peer] = event == zmq.EVENT_HANDSHAKE_SUCCEEDED
                monitor.close(0)
                sock.close(0)
    finally:
        ctx.term()
        service.close()
    admitted = {key for key, ok in outcome.items() if ok}
    assert admitted == {("frontend", FRONTEND), ("executor", EXECUTOR)}, outcome


def test_keys_made_before_the_per_socket_lists_gain_them(tmp_path):
    """An older keys directory (server + client only) gets the frontend and executor
    keypairs and their allow-lists on the next `folio keys`, its own keys kept."""
    keys = tmp_path / "keys"
    generate_keys(keys)
    for name in ("frontend", "executor"):
        (keys / f"{name}.key").unlink()
        (keys / f"{name}.key_secret").unlink()
        for listed in (keys / f"authorized_{name}s").iterdir():
            listed.unlink()
    before = (keys / "client.key_secret").read_bytes()
    written = generate_keys(keys)
    assert (keys / "client.key_secret").read_bytes() == before
    assert {p.name for p in written} == {"frontend.key", "frontend.key_secret", "executor.key",
                                         "executor.key_secret"}
    assert load_keys(keys, peer="executor").client_secret


@pytest.mark.parametrize("argv, flag", [
    (["scheduler", "--frontend-address", "tcp://192.0.2.7:5556", "--executor-address",
      "ipc:///tmp/folio-test-ex.sock"], "--frontend-address"),
    (["scheduler", "--frontend-address", "tcp://127.0.0.1:5556", "--executor-address",
      "tcp://127.0.0.1:5557"], "--executor-address"),
    (["executor", "--scheduler-address", "tcp://127.0.0.1:5557"], "--scheduler-address"),
    (["frontend", "--client-address", "tcp://192.0.2.7:5555", "--scheduler-address",
      "ipc:///tmp/folio-test-fe.sock"], "--client-address"),
    (["frontend", "--client-address", "ipc:///tmp/folio-test-c.sock", "--scheduler-address",
      "tcp://scheduler:5556"], "--scheduler-address"),
    (["serve", "--zmq-address", "tcp://192.0.2.7:5555"], "--zmq-address"),
])
def test_tcp_without_curve_that_others_could_reach_is_refused(argv, flag, capsys):
    """No unauthenticated link beyond the machine (nor an executor link on any TCP):
    refused in one line naming the flag and the way out, before any socket exists."""
    from folio.cli import main

    assert main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and flag in err and "--curve-keys" in err, err
    assert "--insecure-transport" in err


def test_insecure_transport_lets_a_plain_tcp_link_through(tmp_path):
    from folio.checks import check_links
    from folio.shared.config import SettingError

    with pytest.raises(SettingError):
        check_links(False, False, ("executor_address",), executor_address="tcp://127.0.0.1:1")
    check_links(False, True, ("executor_address",), executor_address="tcp://127.0.0.1:1")
    check_links(True, False, ("executor_address",), executor_address="tcp://10.0.0.1:1")
    check_links(False, False, frontend_address="tcp://[::1]:5556,tcp://localhost:7")
