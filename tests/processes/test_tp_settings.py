"""Multi-node tensor-parallel settings that cannot work are refused before anything starts:
one line naming the setting, exit status 2 (folio/checks.py's check_nodes)."""

from __future__ import annotations

import pytest

from folio.cli import main

TP2 = ("--tensor-parallel-size", "2")
LINK = ("--scheduler-address", "ipc:///tmp/folio-none.sock")


@pytest.mark.parametrize(("command", "args", "line"), [
    ("executor", (*LINK, "--nnodes", "2", "--node-rank", "2"),
     "--node-rank 2 must be below --nnodes 2"),
    ("executor", (*LINK, "--nnodes", "4", "--master-addr", "10.0.0.1"),
     "--nnodes 4 does not divide --tensor-parallel-size 2: every node runs an equal share "
     "of the ranks"),
    ("executor", ("--headless",),
     "--headless needs --nnodes > 1: a headless node runs its share of a group spread over "
     "several nodes"),
    ("executor", ("--headless", "--nnodes", "2", "--master-addr", "10.0.0.1"),
     "--headless needs --node-rank > 0: node 0 holds rank 0, which the scheduler talks to "
     "(run it without --headless)"),
    ("executor", ("--headless", "--nnodes", "2", "--node-rank", "1"),
     "--master-addr is required with --nnodes > 1: node 0's address the other nodes reach"),
    ("executor", ("--headless", "--nnodes", "2", "--node-rank", "1", "--master-addr", "h"),
     "--curve-keys is required with --nnodes > 1: rank 0's plans travel to the other nodes "
     "over TCP (or --insecure-transport on a trusted network)"),
    ("executor", ("--nnodes", "2", "--master-addr", "h"),
     "--scheduler-address is required (unless --headless)"),
    ("serve", ("--nnodes", "2", "--node-rank", "1", "--master-addr", "h"),
     "--node-rank 1 runs tensor-parallel ranks only: start it with `folio serve --headless` "
     "(or `folio executor --headless`; node 0 runs the scheduler)"),
    # vLLM's form of a worker node: `folio serve --headless` checks as the executor's does.
    ("serve", ("--headless",),
     "--headless needs --nnodes > 1: a headless node runs its share of a group spread over "
     "several nodes"),
    ("serve", ("--headless", "--nnodes", "2", "--node-rank", "1", "--master-addr", "h"),
     "--curve-keys is required with --nnodes > 1: rank 0's plans travel to the other nodes "
     "over TCP (or --insecure-transport on a trusted network)"),
    ("serve", ("--headless", "--nnodes", "2", "--node-rank", "1", "--zmq-address",
               "tcp://127.0.0.1:5555"),
     "--zmq-address does not apply with --headless: a worker node runs tensor-parallel "
     "ranks only"),
    ("serve", ("--nnodes", "2", "--master-addr", "h", "--insecure-transport",
               "--data-parallel-size", "2"),
     "--data-parallel-size with --nnodes > 1 is not supported: one tensor-parallel group "
     "spans the nodes"),
])
def test_a_layout_that_cannot_work_is_refused_in_one_line(llama_dir, capsys, command, args,
                                                           line):
    assert main([command, "--model", str(llama_dir), *TP2, *args]) == 2
    assert capsys.readouterr().err.strip() == f"folio {command}: error: {line}"
