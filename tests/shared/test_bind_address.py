"""The wildcard guard: a bind to every interface is refused however its address is written
(IPv4's legacy forms, IPv6 spellings, IPv4-mapped IPv6, a name resolving to one) unless
FOLIO_ALLOW_WILDCARD=1; a name that resolves to nothing is a clear error."""

from __future__ import annotations

import socket

import pytest

from folio.checks import check_bind
from folio.shared.settings import SettingError
from folio.shared.transport import check_bind_address

WILDCARDS = ["tcp://*:5555", "tcp://0.0.0.0:5555", "tcp://[::]:5555", "tcp://0:5555",
             "tcp://0.0.0.00:5555", "tcp://0x0:5555", "tcp://00:5555", "tcp://0.0:5555",
             "tcp://[::0]:5555", "tcp://[0:0:0:0:0:0:0:0]:5555",
             "tcp://[::ffff:0.0.0.0]:5555", "tcp://[::ffff:0:0]:5555", "tcp://:5555",
             "tcp://0.0.0.0:*"]
SPECIFIC = ["tcp://127.0.0.1:5555", "tcp://127.1:5555", "tcp://0x7f000001:5555",
            "tcp://[::1]:5555", "tcp://[::ffff:127.0.0.1]:5555", "tcp://192.0.2.7:*",
            "tcp://localhost:5555", "ipc:///tmp/folio.sock", "inproc://link"]


@pytest.fixture(autouse=True)
def _no_wildcard_permission(monkeypatch):
    monkeypatch.delenv("FOLIO_ALLOW_WILDCARD", raising=False)


def _resolving_to(monkeypatch, *ips: str) -> None:
    """getaddrinfo answers every name with `ips` (no DNS in a unit test)."""
    def fake(host, port, *args, **kwargs):
        return [(socket.AF_INET6 if ":" in ip else socket.AF_INET, socket.SOCK_STREAM, 6, "",
                 (ip, 0)) for ip in ips]
    monkeypatch.setattr(socket, "getaddrinfo", fake)


@pytest.mark.parametrize("address", WILDCARDS)
def test_every_spelling_of_the_unspecified_address_is_refused(address):
    with pytest.raises(ValueError, match="refusing to bind .*FOLIO_ALLOW_WILDCARD=1"):
        check_bind_address(address)


@pytest.mark.parametrize("address", WILDCARDS)
def test_wildcards_pass_where_allowed(address, monkeypatch):
    monkeypatch.setenv("FOLIO_ALLOW_WILDCARD", "1")
    assert check_bind_address(address) == address


@pytest.mark.parametrize("address", SPECIFIC)
def test_a_specific_interface_passes(address):
    assert check_bind_address(address) == address


def test_a_name_resolving_to_the_unspecified_address_is_refused(monkeypatch):
    _resolving_to(monkeypatch, "10.0.0.5", "0.0.0.0")
    with pytest.raises(ValueError, match="refusing to bind tcp://blocked.example:5555"):
        check_bind_address("tcp://blocked.example:5555")
    _resolving_to(monkeypatch, "::ffff:0.0.0.0")
    with pytest.raises(ValueError, match="refusing to bind"):
        check_bind_address("tcp://blocked.example:5555")


def test_a_name_resolving_to_an_interface_passes(monkeypatch):
    _resolving_to(monkeypatch, "10.0.0.5", "fe80::1%eth0")
    assert check_bind_address("tcp://node-a.example:5555") == "tcp://node-a.example:5555"


def test_a_name_that_does_not_resolve_is_a_clear_error(monkeypatch):
    def fail(*args, **kwargs):
        raise socket.gaierror(socket.EAI_NONAME, "Name or service not known")
    monkeypatch.setattr(socket, "getaddrinfo", fail)
    with pytest.raises(ValueError, match="cannot bind tcp://nowhere.invalid:5555: host "
                                         "'nowhere.invalid' does not resolve"):
        check_bind_address("tcp://nowhere.invalid:5555")


def test_ip_literals_are_not_resolved(monkeypatch):
    """Only names go to the resolver: a literal is read as it is."""
    def fail(*args, **kwargs):
        raise AssertionError("resolved an IP literal")
    monkeypatch.setattr(socket, "getaddrinfo", fail)
    for address in ("tcp://0x0:1", "tcp://127.1:1", "tcp://[::ffff:0.0.0.0]:1"):
        try:
            check_bind_address(address)
        except ValueError:
            pass


def test_a_host_with_trailing_text_is_no_ipv4_literal(monkeypatch):
    """inet_aton reads "0 x" as 0.0.0.0 and ignores the rest; such a host is a name."""
    _resolving_to(monkeypatch, "10.0.0.5")
    assert check_bind_address("tcp://0 x:5555") == "tcp://0 x:5555"


def test_the_setting_check_names_the_flag():
    """`folio <role>`'s pre-start check names the setting with the hidden wildcard."""
    with pytest.raises(SettingError) as caught:
        check_bind(zmq_address="tcp://0x0:5555")
    assert "zmq_address" in str(caught.value) and "refusing to bind" in str(caught.value)
