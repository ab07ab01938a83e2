"""ZeroMQ CURVE: key directories, server and client sockets, the ZAP allow-list.

A keys directory (`folio keys --dir DIR`, mode 0700) holds:

    server.key, server.key_secret        the servers' keypair: the scheduler's two ROUTERs
                                         and the frontend's client ROUTER
    client.key, client.key_secret        SDK clients' default keypair (more with --client)
    frontend.key, frontend.key_secret    frontends' keypair (the scheduler's frontend socket)
    executor.key, executor.key_secret    executors' keypair (the scheduler's executor socket)
    authorized_clients/*.key             the keys the frontend's client socket accepts
    authorized_frontends/*.key           the keys the scheduler's frontend socket accepts
    authorized_executors/*.key           the keys the scheduler's executor socket accepts

One allow-list per socket, each in its own ZAP domain: an SDK user's key opens the client
socket only, never the scheduler's sockets, and a frontend's key cannot attach an executor.
Servers run a ZAP handler that admits only the keys in their socket's list, and set
ZAP_ENFORCE_DOMAIN so that a missing handler refuses everyone instead of admitting anyone.
A peer without CURVE, with another server key or with an unlisted key never completes the
handshake: it can neither send nor receive a message.
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
CLIENT = "client"       # SDK clients
FRONTEND = "frontend"
EXECUTOR = "executor"
PEERS = (CLIENT, FRONTEND, EXECUTOR)   # who connects; each has its own allow-list
AUTHORIZED = "authorized_clients"


def allow_list(peer: str) -> str:
    """The directory of public keys a server socket for `peer`s accepts."""
    return f"authorized_{peer}s"


def zap_domain(peer: str) -> bytes:
    return f"folio-{peer}s".encode()


@dataclass(frozen=True)
class CurveKeys:
    """What one process loaded from a keys directory (secrets it does not need stay None).
    client_public/client_secret: the keypair this process connects with (its `peer`'s)."""

    directory: Path
    server_public: bytes
    server_secret: bytes | None
    client_public: bytes | None
    client_secret: bytes | None
    peer: str = CLIENT

    @property
    def authorized_dir(self) -> Path:
        return self.directory / AUTHORIZED


def generate_keys(directory: str | os.PathLike, force: bool = False,
                  extra_clients: tuple[str, ...] = ()) -> list[Path]:
    """Write the server, client, frontend and executor keypairs (and any named extra SDK
    clients) into `directory`, each public key into its socket's allow-list.

    Existing keypairs are kept unless `force`, so an init container may run this on every
    start (a directory from before the per-socket lists gains what it lacks). Returns the
    files written."""
    root = Path(directory)
    root.mkdir(parents=True, exist_ok=True)
    root.chmod(0o700)
    for peer in PEERS:
        (root / allow_list(peer)).mkdir(exist_ok=True)
        (root / allow_list(peer)).chmod(0o700)
    written: list[Path] = []
    for name in (SERVER, CLIENT, FRONTEND, EXECUTOR, *extra_clients):
        if not name or "/" in name or name.startswith(".") or (
                name in (SERVER, FRONTEND, EXECUTOR) and name in extra_clients):
            raise ValueError(f"bad key name {name!r}")
        public, secret = root / f"{name}.key", root / f"{name}.key_secret"
        if force or not (public.exists() and secret.exists()):
            public_file, secret_file = zmq.auth.create_certificates(root, name)
            os.chmod(secret_file, 0o600)
            written += [Path(public_file), Path(secret_file)]
        if name == SERVER:
            continue
        listed = root / allow_list(name if name in (FRONTEND, EXECUTOR) else CLIENT)
        if force or not (listed / public.name).exists():
            shutil.copyfile(public, listed / public.name)
            written.append(listed / public.name)
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
              client: bool = True, peer: str = CLIENT,
              serves: tuple[str, ...] = (CLIENT,)) -> CurveKeys:
    """Load what a server (server secret) and/or a connecting peer (the keypair of `peer`:
    client, frontend or executor) needs. `serves`: the allow-lists a server checks."""
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
        client_public, client_secret = _load(root / f"{peer}.key_secret", True)
    for listed in (allow_list(p) for p in serves) if server else ():
        if not any((root / listed).glob("*.key")):
            raise FileNotFoundError(f"no public keys in {root / listed}: every peer would be "
                                    f"refused (run `folio keys --dir {root}`)")
    return CurveKeys(root, server_public, server_secret, client_public, client_secret, peer)


def as_key(value: str | bytes) -> bytes:
    """A Z85 key (40 characters) given as str or bytes."""
    key = value.encode() if isinstance(value, str) else bytes(value)
    if len(key) != 40:
        raise ValueError("a CURVE key is 40 Z85 characters (see `folio keys`)")
    return key


def make_server(sock: zmq.Socket, keys: CurveKeys | None, peer: str = CLIENT) -> zmq.Socket:
    """Before bind: CURVE server with the server keypair; ZAP admits only the keys in the
    allow-list of `peer` (who connects here: client, frontend or executor)."""
    if keys is not None:
        if keys.server_secret is None:
            raise ValueError("this process needs the server's secret key")
        serve_curve(sock, keys.server_public, keys.server_secret, peer)
    return sock


def serve_curve(sock: zmq.Socket, public: bytes, secret: bytes, peer: str) -> zmq.Socket:
    """Before bind: a CURVE server with this keypair; ZAP admits only `peer`'s allow-list."""
    sock.setsockopt(zmq.ZAP_DOMAIN, zap_domain(peer))
    sock.setsockopt(zmq.ZAP_ENFORCE_DOMAIN, 1)
    sock.curve_secretkey = secret
    sock.curve_publickey = public
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


def start_authenticator(ctx: zmq.Context, keys: CurveKeys | None,
                        serves: tuple[str, ...] = (CLIENT,)) -> ThreadAuthenticator | None:
    """A ZAP handler admitting, on each socket made with make_server(..., peer), only the
    keys in that peer's allow-list. Start it before binding; stop it before ctx.term()."""
    if keys is None:
        return None
    auth = ThreadAuthenticator(ctx)
    auth.start()
    for peer in serves:
        domain, location = zap_domain(peer).decode(), keys.directory / allow_list(peer)
        auth.configure_curve(domain=domain, location=str(location))
        if not auth.certs.get(domain):
            auth.stop()
            raise FileNotFoundError(f"could not load public keys from {location}")
    return auth


def stop_authenticator(auth: ThreadAuthenticator | None) -> None:
    if auth is not None:
        auth.stop()
