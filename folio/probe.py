"""`folio probe ROLE ADDRESS`: a cheap health check for containers (exit 0 when healthy).

- frontend: GET its /health URL (200), or ask its client socket for `health` (`ok`).
- scheduler: ask the scheduler's frontend socket for `stats`; any answer means alive.
  A probe is answered but not counted as a frontend.
- executor: the same `stats`, and the scheduler must report an executor attached.
"""

from __future__ import annotations

import urllib.error
import urllib.request

import zmq

from folio.shared.protocol import messages as m
from folio.shared.security import FRONTEND, load_keys, make_peer
from folio.shared.transport import configure
from folio.shared.protocol.wire import ProtocolError


def probe(role: str, address: str, timeout: float, curve_keys: str | None) -> int:
    try:
        healthy, detail = _check(role, address, timeout, curve_keys)
    except Exception as error:   # a probe reports, it never raises
        healthy, detail = False, f"{type(error).__name__}: {error}"
    print(f"{role} {'healthy' if healthy else 'unhealthy'}: {detail}", flush=True)
    return 0 if healthy else 1


def _check(role: str, address: str, timeout: float, curve_keys: str | None
           ) -> tuple[bool, str]:
    if address.startswith(("http://", "https://")):
        try:
            with urllib.request.urlopen(address, timeout=timeout) as response:
                return response.status == 200, f"HTTP {response.status}"
        except urllib.error.HTTPError as error:
            return False, f"HTTP {error.code}"
    if role == "frontend":
        from folio.client import Client

        with Client(address, timeout=timeout, connect_timeout=timeout,
                    curve_keys=curve_keys) as client:
            health = client.health(timeout=timeout)
        return bool(health.get("ok")), f"ok={health.get('ok')}"
    stats = _scheduler_stats(address, timeout, curve_keys)
    if stats is None:
        return False, f"no answer from the scheduler at {address} within {timeout:g} s"
    if role == "executor":
        alive = bool(stats.get("executor_alive"))
        return alive, "executor attached" if alive else "no executor attached"
    return True, "scheduler answered"


def _scheduler_stats(address: str, timeout: float, curve_keys: str | None) -> dict | None:
    ctx = zmq.Context()
    # The scheduler's frontend socket admits the frontends' key (not an SDK user's).
    keys = load_keys(curve_keys, peer=FRONTEND) if curve_keys else None
    sock = make_peer(configure(ctx.socket(zmq.DEALER)), keys)
    try:
        sock.connect(address)
        sock.send(m.encode_stats_request())
        if not sock.poll(int(timeout * 1000)):
            return None
        try:
            msg_type, body = m.decode(sock.recv(), frozenset({m.MessageType.STATS}))
            return m.decode_stats(body)
        except ProtocolError:
            return None
    finally:
        sock.close(0)
        ctx.term()
