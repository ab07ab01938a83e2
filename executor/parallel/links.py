"""The plan hop from rank 0 to the ranks on other nodes: TCP with CURVE.

Rank 0 binds one ROUTER on master_addr:(master_port + 1); each rank on another node
connects a DEALER, says hello (its pid and its engine settings), and then receives every
scheduler message rank 0 passes on. Both ends authenticate with the executor keypair every
executor of the deployment already holds (`folio keys`: executor.key, admitted by
authorized_executors/): rank 0 is the CURVE server with it, the other ranks connect with
it, so only a holder of the executor secret can take or send plans.

A lost link ends the group: a watcher thread at each end sees the disconnect (a closed
connection at once, a silent peer after the ZeroMQ heartbeat timeout, ~1 s). Rank 0's main
thread then fails the step and stops the group; if it does not within STUCK_S, it is inside
a collective that waits for the lost node (gloo and NCCL wait as long as the group may be
idle), and the watcher ends the process, which the scheduler sees at once. A remote rank
exits at once; its node starts it again (executor/parallel/headless.py) and it rejoins the next
group.
"""

from __future__ import annotations

import json
import logging
import os
import socket
import threading
import time
from collections.abc import Callable
from dataclasses import asdict

import zmq
from folio.shared.config import EngineConfig
from folio.shared.security import (
    EXECUTOR,
    load_keys,
    make_client,
    start_authenticator,
    stop_authenticator,
    serve_curve,
)
from folio.shared.transport import (
    DOWN_EVENTS,
    UP_EVENTS,
    configure,
    monitor_socket,
    read_monitor_event,
)

log = logging.getLogger("folio.executor")

STUCK_S = 5.0

# Settings that may differ between nodes: paths, this node's index, its threads.
NODE_OWN = ("model", "tokenizer", "node_rank", "cpu_threads")


def plan_address(engine: EngineConfig) -> str:
    return f"tcp://{socket.gethostbyname(engine.master_addr)}:{engine.master_port + 1}"


def group_settings(engine: EngineConfig) -> dict:
    """The engine settings every node of a group must agree on, as JSON carries them (a
    tuple setting comes back a list: both sides compare that form)."""
    return json.loads(json.dumps({k: v for k, v in asdict(engine).items() if k not in NODE_OWN}))


def _curve(sock: zmq.Socket, keys_dir: str | None, server: bool) -> zmq.Socket:
    if keys_dir is None:
        return sock
    keys = load_keys(keys_dir, peer=EXECUTOR)
    if server:   # the executor keypair serves: every node's ranks hold it
        return serve_curve(sock, keys.client_public, keys.client_secret, EXECUTOR)
    return make_client(sock, keys.client_public, keys.client_public, keys.client_secret)


class RemotePlans:
    """Rank 0's end: the ROUTER the other nodes' ranks connect to."""

    def __init__(self, engine: EngineConfig, remote_ranks: tuple[int, ...],
                 keys_dir: str | None) -> None:
        self.engine = engine
        self.remote_ranks = remote_ranks
        self.ctx = zmq.Context()
        self.auth = start_authenticator(self.ctx, load_keys(keys_dir, peer=EXECUTOR),
                                        serves=(EXECUTOR,)) if keys_dir else None
        self.sock = _curve(configure(self.ctx.socket(zmq.ROUTER)), keys_dir, server=True)
        self.sock.setsockopt(zmq.ROUTER_MANDATORY, 1)   # a gone peer raises, not drops
        self.monitor = monitor_socket(self.sock)
        self.address = plan_address(engine)
        self.sock.bind(self.address)
        self.peers: dict[int, tuple[bytes, int]] = {}   # rank: (identity, pid)
        self.lost: str | None = None
        self.closing = threading.Event()
        self.watcher = threading.Thread(target=self._watch, daemon=True)
        self.watcher.start()

    def wait_joined(self, timeout_s: float, check: Callable[[], None]) -> None:
        """Until every remote rank has said hello (they are past the rendezvous, so they
        connect within moments); `check` raises when a local rank died meanwhile."""
        deadline = time.monotonic() + timeout_s
        while len(self.peers) < len(self.remote_ranks):
            check()
            if time.monotonic() > deadline:
                missing = sorted(set(self.remote_ranks) - set(self.peers))
                raise ConnectionError(f"tensor-parallel ranks {missing} joined the group but "
                                      f"never reached {self.address} (the plan hop)")
            if not self.sock.poll(100):
                continue
            identity, pid, settings = self.sock.recv_multipart()
            rank = int(identity.decode().removeprefix("rank-"))
            theirs, ours = json.loads(settings), group_settings(self.engine)
            differ = sorted(k for k in ours if theirs.get(k) != ours[k])
            if differ:
                raise ValueError(f"tensor-parallel rank {rank} runs other engine settings "
                                 "than rank 0: " + ", ".join(
                                     f"{k}={theirs.get(k)!r} there, {ours[k]!r} here"
                                     for k in differ))
            self.peers[rank] = (identity, int(pid))

    @property
    def pids(self) -> dict[int, int]:
        return {rank: pid for rank, (_, pid) in self.peers.items()}

    def down(self) -> str | None:
        """Why the hop to another node is down, once a link to it was lost."""
        return self.lost

    def _watch(self) -> None:
        if not _watch_links(self.monitor, self.closing):
            return
        self.lost = (f"the link to tensor-parallel ranks {list(self.remote_ranks)} on other "
                     f"nodes was lost ({self.address})")
        if not self.closing.wait(STUCK_S):
            log.error("%s, and rank 0 is stuck in a collective waiting for them: exiting",
                      self.lost)
            os._exit(1)

    def send(self, data: bytes) -> None:
        for rank, (identity, _) in self.peers.items():
            try:
                self.sock.send_multipart([identity, data], copy=False)
            except zmq.ZMQError as error:
                self.lost = f"tensor-parallel rank {rank} is unreachable ({error})"
                raise ConnectionError(self.lost) from None

    def close(self) -> None:
        self.closing.set()
        self.watcher.join()
        self.monitor.close(0)
        self.sock.close(0)
        stop_authenticator(self.auth)
        self.ctx.term()


class PlanReceiver:
    """A rank on another node: its link to rank 0's ROUTER."""

    def __init__(self, address: str, rank: int, engine: EngineConfig,
                 keys_dir: str | None) -> None:
        self.ctx = zmq.Context()
        self.sock = _curve(configure(self.ctx.socket(zmq.DEALER)), keys_dir, server=False)
        self.sock.setsockopt(zmq.IDENTITY, f"rank-{rank}".encode())
        self.monitor = monitor_socket(self.sock)
        self.sock.connect(address)
        self.address = address
        self.closing = threading.Event()
        self.watcher = threading.Thread(target=self._watch, daemon=True)
        self.watcher.start()
        # Queued until the handshake: rank 0 reads it once past the rendezvous.
        self.sock.send_multipart([str(os.getpid()).encode(),
                                  json.dumps(group_settings(engine)).encode()])

    def recv(self) -> bytes:
        return self.sock.recv()

    def _watch(self) -> None:
        """Rank 0 gone: this rank ends (waiting for a plan or inside a collective alike)."""
        if _watch_links(self.monitor, self.closing):
            log.error("lost the link to rank 0 at %s: this rank ends", self.address)
            os._exit(1)

    def close(self) -> None:
        self.closing.set()
        self.watcher.join()
        self.monitor.close(0)
        self.sock.close(0)
        self.ctx.term()


def _watch_links(monitor: zmq.Socket, closing: threading.Event) -> bool:
    """True once a link that was up went down; False when `closing` was set first."""
    up = False
    while not closing.is_set():
        if not monitor.poll(100):
            continue
        event = read_monitor_event(monitor)
        up = up or bool(event & UP_EVENTS)
        if up and event & DOWN_EVENTS:
            return True
    return False
