"""ZeroMQ CURVE: key directories, server and client sockets, the ZAP allow-list.

A keys directory (`folio keys --dir DIR`, mode 0700) holds:

    server.key, server.key_secret     the servers' keypair: the scheduler's two ROUTERs and
                                      the frontend's client ROUTER
    client.key, client.key_secret     the connecting peers' keypair: frontends, executors, SDK
    authorized_clients/*.key          the client public keys servers accept (ZAP allow-list)

Servers run a ZAP handler that admits only the keys in authorized_clients/, and set
ZAP_ENFORCE_DOMAIN so that a missing handler refuses everyone instead of admitting anyone.
A peer without CURVE, with another server key or with an unlisted client key never completes
the handshake: it can neither send nor receive a message.
"""

from __future__ import annotations

import os
import shutil
from dataclasses import dataclass
from pathlib import Path

import zmq
import zmq.auth
from zmq.auth.thread import ThreadAuthenticator

SERVER = "server"
CLIENT = "client"
AUTHORIZED = "authorized_clients"
ZAP_DOMAIN = b"folio"


@dataclass(frozen=True)
class CurveKeys:
    """What one process loaded from a keys directory (secrets it does not need stay None)."""

    directory: Path
    server_public: bytes
    server_secret: bytes | None
    client_public: bytes | None
    client_secret: bytes | None

    @property
    def authorized_dir(self) -> Path:
        return self.directory / AUTHORIZED


def generate_keys(directory: str | os.PathLike, force: bool = False,
                  extra_clients: tuple[str, ...] = ()) -> list[Path]:
    """Write the server and client keypairs (and any named extra clients) into `directory`.

    Existing keypairs are kept unless `force`, so an init container may run this on every
    start. Returns the files written."""
    root = Path(directory)
    root.mkdir(parents=True, exist_ok=True)
    root.chmod(0o700)
    authorized = root / AUTHORIZED
    authorized.mkdir(exist_ok=True)
    authorized.chmod(0o700)
    written: list[Path] = []
    for name in (SERVER, CLIENT, *extra_clients):
        if not name or "/" in name or name.startswith("."):
            raise ValueError(f"bad key name {name!r}")
        public, secret = root / f"{name}.key", root / f"{name}.key_secret"
        if force or not (public.exists() and secret.exists()):
            public_file, secret_file = zmq.auth.create_certificates(root, name)
            os.chmod(secret_file, 0o600)
            written += [Path(public_file), Path(secret_file)]
        if name != SERVER and (force or not (authorized / public.name).exists()):
            shutil.copyfile(public, authorized / public.name)
            written.append(authorized / public.name)
    return written


def _load(path: Path, need_secret: bool) -> tuple[bytes, bytes | None]:
    if not path.exists():
        raise FileNotFoundError(f"CURVE key file {path} is missing; run `folio keys --dir "
                                f"{path.parent}`")
    public, secret = zmq.auth.load_certificate(path)
    if need_secret and not secret:
        raise ValueError(f"{path} holds no secret key")
    return public, secret


def load_keys(directory: str | os.PathLike, server: bool = False,
              client: bool = True) -> CurveKeys:
    """Load what a server (server secret) and/or a client (client keypair) needs."""
    root = Path(directory)
    if not root.is_dir():
        raise FileNotFoundError(f"CURVE keys directory {root} does not exist; create it with "
                                f"`folio keys --dir {root}`")
    if server:
        server_public, server_secret = _load(root / f"{SERVER}.key_secret", True)
    else:
        server_public, server_secret = _load(root / f"{SERVER}.key", False)[0], None
    client_public = client_secret = None
    if client:
        client_public, client_secret = _load(root / f"{CLIENT}.key_secret", True)
    if server and not any((root / AUTHORIZED).glob("*.key")):
        raise FileNotFoundError(f"no client public keys in {root / AUTHORIZED}: every peer "
                                "would be refused")
    return CurveKeys(root, server_public, server_secret, client_public, client_secret)


def as_key(value: str | bytes) -> bytes:
    """A Z85 key (40 characters) given as str or bytes."""
    key = value.encode() if isinstance(value, str) else bytes(value)
    if len(key) != 40:
        raise ValueError("a CURVE key is 40 Z85 characters (see `folio keys`)")
    return key


def make_server(sock: zmq.Socket, keys: CurveKeys | None) -> zmq.Socket:
    """Before bind: CURVE server with the server keypair; ZAP decides who may connect."""
    if keys is not None:
        if keys.server_secret is None:
            raise ValueError("this process needs the server's secret key")
        sock.setsockopt(zmq.ZAP_DOMAIN, ZAP_DOMAIN)
        sock.setsockopt(zmq.ZAP_ENFORCE_DOMAIN, 1)
        sock.curve_secretkey = keys.server_secret
        sock.curve_publickey = keys.server_public
        sock.curve_server = True
    return sock


def make_client(sock: zmq.Socket, server_public: bytes, public: bytes,
                secret: bytes) -> zmq.Socket:
    """Before connect: CURVE client that only talks to the server holding `server_public`."""
    sock.curve_serverkey = as_key(server_public)
    sock.curve_publickey = as_key(public)
    sock.curve_secretkey = as_key(secret)
    return sock


def make_peer(sock: zmq.Socket, keys: CurveKeys | None) -> zmq.Socket:
    """Before connect, for Folio's own processes: CURVE client with the client keypair."""
    if keys is not None:
        make_client(sock, keys.server_public, keys.client_public, keys.client_secret)
    return sock


def start_authenticator(ctx: zmq.Context, keys: CurveKeys | None) -> ThreadAuthenticator | None:
    """A ZAP handler admitting only authorized_clients/*.key. Start it before binding; stop
    it before ctx.term()."""
    if keys is None:
        return None
    auth = ThreadAuthenticator(ctx)
    auth.start()
    auth.configure_curve(domain=ZAP_DOMAIN.decode(), location=str(keys.authorized_dir))
    if not auth.certs.get(ZAP_DOMAIN.decode()):
        auth.stop()
        raise FileNotFoundError(f"could not load client keys from {keys.authorized_dir}")
    return auth


def stop_authenticator(auth: ThreadAuthenticator | None) -> None:
    if auth is not None:
        auth.stop()
