"""Where a tensor-parallel group's ranks run: which node holds which rank, where they meet
(the torch.distributed rendezvous) and which network interface their collectives use.

Node r of `nnodes` holds the consecutive ranks r*per_node .. (r+1)*per_node-1 (vLLM's and
SGLang's layout), rank r on local GPU r - r*per_node. With one node the rendezvous is a free
loopback port; across nodes it is master_addr:master_port on node 0.
"""

from __future__ import annotations

import array
import fcntl
import os
import socket
from dataclasses import dataclass

from folio.shared.config import EngineConfig

SIOCGIFADDR = 0x8915   # Linux: an interface's IPv4 address


@dataclass(frozen=True)
class NodeLayout:
    size: int        # ranks in the group
    nnodes: int
    node_rank: int   # this node

    @classmethod
    def of(cls, engine: EngineConfig) -> NodeLayout:
        return cls(engine.tensor_parallel_size, engine.nnodes, engine.node_rank)

    @property
    def per_node(self) -> int:
        return self.size // self.nnodes

    def ranks_on(self, node: int) -> range:
        return range(node * self.per_node, (node + 1) * self.per_node)

    @property
    def local_ranks(self) -> range:
        return self.ranks_on(self.node_rank)

    @property
    def remote_ranks(self) -> tuple[int, ...]:
        """Ranks on other nodes than node 0 (rank 0 reaches them over TCP)."""
        return tuple(range(self.per_node, self.size))

    def node_of(self, rank: int) -> int:
        return rank // self.per_node

    def local_index(self, rank: int) -> int:
        """The rank's place on its node: its GPU, its share of the node's cores."""
        return rank - self.node_of(rank) * self.per_node


def rendezvous_address(engine: EngineConfig) -> str:
    if engine.nnodes == 1:
        with socket.socket() as sock:
            sock.bind(("127.0.0.1", 0))
            return f"tcp://127.0.0.1:{sock.getsockname()[1]}"
    return f"tcp://{engine.master_addr}:{engine.master_port}"


def choose_interface(master_addr: str) -> None:
    """Across nodes, gloo and NCCL use the interface that routes to node 0, unless the
    operator named one (GLOO_SOCKET_IFNAME, NCCL_SOCKET_IFNAME). Left alone, gloo binds
    the address this host's name resolves to, which need not be on the nodes' network
    (a pod, a network namespace) and then falls back to loopback."""
    name = interface_towards(master_addr)
    if name is not None:
        os.environ.setdefault("GLOO_SOCKET_IFNAME", name)
        os.environ.setdefault("NCCL_SOCKET_IFNAME", name)


def interface_towards(host: str) -> str | None:
    """The name of the interface whose IPv4 address this host uses to reach `host`."""
    try:
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
            probe.connect((socket.gethostbyname(host), 9))   # UDP: nothing is sent
            local = probe.getsockname()[0]
    except OSError:
        return None
    for _, name in socket.if_nameindex():
        if _ipv4_of(name) == local:
            return name
    return None


def _ipv4_of(name: str) -> str | None:
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
        # struct ifreq: the interface name, NUL-padded, then room for the address.
        request = array.array("B", name.encode()[:15].ljust(256, b"\0"))
        try:
            fcntl.ioctl(sock.fileno(), SIOCGIFADDR, request)
        except OSError:   # no IPv4 address on it
            return None
    return socket.inet_ntoa(request.tobytes()[20:24])
