"""The node layout of a tensor-parallel group spread over machines (executor/parallel/nodes.py)."""

from __future__ import annotations

from folio.executor.parallel.nodes import NodeLayout, interface_towards


def test_each_node_holds_consecutive_ranks_on_its_own_gpus():
    layout = NodeLayout(size=8, nnodes=2, node_rank=1)
    assert layout.per_node == 4
    assert [list(layout.ranks_on(n)) for n in range(2)] == [[0, 1, 2, 3], [4, 5, 6, 7]]
    assert list(layout.local_ranks) == [4, 5, 6, 7]
    assert layout.remote_ranks == (4, 5, 6, 7)   # what rank 0 reaches over TCP
    assert [layout.node_of(r) for r in (0, 3, 4, 7)] == [0, 0, 1, 1]
    assert [layout.local_index(r) for r in (0, 3, 4, 7)] == [0, 3, 0, 3]
    one = NodeLayout(size=2, nnodes=1, node_rank=0)
    assert list(one.local_ranks) == [0, 1] and one.remote_ranks == ()


def test_the_interface_towards_an_address_is_the_one_holding_the_route():
    assert interface_towards("127.0.0.1") == "lo"
    assert interface_towards("no-such-host.invalid") is None
