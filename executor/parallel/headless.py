"""`folio executor --headless`: a node that runs tensor-parallel ranks only (node_rank > 0).

It starts its share of the ranks (executor/parallel/nodes.py's layout), which join node 0's group
at master_addr:master_port and take rank 0's plans over TCP + CURVE (executor/parallel/links.py).
When the group breaks (a rank here exits, or rank 0 went away and its link dropped) it stops
its other ranks and starts them all again: they wait in the rendezvous until node 0 starts
its next group (`folio serve` restarts rank 0), so the group comes back without an operator.
SIGTERM stops the ranks and ends the node.
"""

from __future__ import annotations

import logging
import signal
import subprocess
import threading

from folio.executor.parallel.group import STOP_GRACE_S, backend_of, spawn_rank
from folio.executor.parallel.links import plan_address
from folio.executor.parallel.nodes import NodeLayout, choose_interface, rendezvous_address
from folio.shared.config import EngineConfig
from folio.shared.cpus import usable_cores

log = logging.getLogger("folio.executor")

POLL_S = 0.2
REJOIN_PAUSE_S = 1.0   # lets the broken group's rank 0 exit before the next rendezvous


def run_headless(engine: EngineConfig, curve_keys: str | None) -> int:
    layout = NodeLayout.of(engine)
    choose_interface(engine.master_addr)   # inherited by the ranks
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    signal.signal(signal.SIGINT, lambda *_: stop.set())
    cores, backend = usable_cores(), backend_of(engine)
    address, plans = rendezvous_address(engine), plan_address(engine)
    while not stop.is_set():
        ranks = {rank: spawn_rank(rank, address, backend, engine, cores, plans, curve_keys)
                 for rank in layout.local_ranks}
        log.info("node %d of %d: ranks %s joining the group at %s (pids %s)",
                 layout.node_rank, layout.nnodes, list(ranks), address,
                 ", ".join(str(p.pid) for p in ranks.values()))
        exited = None
        while exited is None and not stop.wait(POLL_S):
            exited = next(((r, p.returncode) for r, p in ranks.items()
                           if p.poll() is not None), None)
        _stop(ranks.values())
        if exited is not None:
            log.warning("node %d: rank %d exited with %d; the group is broken, this node's "
                        "ranks rejoin the next one", layout.node_rank, *exited)
            stop.wait(REJOIN_PAUSE_S)
    return 0


def _stop(procs) -> None:
    for proc in procs:
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
    for proc in procs:
        try:
            proc.wait(timeout=STOP_GRACE_S)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
