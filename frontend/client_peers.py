"""Who an SDK connection belongs to (the ZeroMQ gateway's clients): --max-requests-per-client
counts a client's requests over all its connections, and the scheduler's turns between
clients (scheduler/fairness/) name it.

A client is its connection's peer as libzmq reports it ("Peer-Address"): over tcp:// the
peer's IP address (every process on one host is one client), over ipc:// the peer process
(libzmq gives its credentials, pid included). A connection whose peer cannot be read is a
client of its own. Bounded: a connection is forgotten once it has nothing in flight and the
table is full."""

from __future__ import annotations

MAX_CONNECTIONS = 65536


def peer_of(frame, connection: bytes) -> str:
    """The client a received frame's connection belongs to."""
    try:
        peer = frame.get("Peer-Address")
    except Exception:   # zmq.ZMQError (EINVAL): no such property for this transport
        peer = ""
    return peer or f"connection:{connection.hex()}"


class ClientPeers:
    def __init__(self, limit: int = MAX_CONNECTIONS) -> None:
        self.limit = limit
        self._peer: dict[bytes, str] = {}      # connection -> client
        self._load: dict[str, int] = {}        # client -> requests in flight

    def note(self, connection: bytes, frame) -> None:
        """A message arrived on `connection`: learn its client (once)."""
        if connection in self._peer:
            return
        if len(self._peer) >= self.limit:
            idle = [c for c, p in self._peer.items() if not self._load.get(p)]
            for gone in idle[:max(1, len(idle) // 2)]:
                del self._peer[gone]
        self._peer[connection] = peer_of(frame, connection)

    def client(self, connection: bytes) -> str:
        return self._peer.get(connection) or f"connection:{connection.hex()}"

    def load(self, connection: bytes) -> int:
        """Requests in flight of this connection's client, over all its connections."""
        return self._load.get(self.client(connection), 0)

    def started(self, connection: bytes) -> None:
        client = self.client(connection)
        self._load[client] = self._load.get(client, 0) + 1

    def ended(self, connection: bytes, count: int = 1) -> None:
        client = self.client(connection)
        left = self._load.get(client, 0) - count
        if left > 0:
            self._load[client] = left
        else:
            self._load.pop(client, None)
