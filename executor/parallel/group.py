"""The ranks of a tensor-parallel executor: rank 0 is the `folio executor` process (the one
the scheduler talks to); it starts the other ranks of its node as child processes and joins
them in one torch.distributed group (gloo on CPU, NCCL on CUDA, a node's rank r on its GPU
r). With --nnodes > 1 the other nodes' ranks are started there (`folio executor
--headless`, executor/parallel/headless.py) and join at master_addr:master_port
(executor/parallel/nodes.py).

Each scheduler message that changes state (a plan, a reset) is passed on by rank 0, as the
same bytes, to the others, which apply it in the same order: the scheduler sends once per
step. The hop is a ZeroMQ PUSH per rank on ipc:// sockets in a private directory for the
ranks on rank 0's node, TCP + CURVE to the other nodes' ranks (executor/parallel/links.py), not a
gloo broadcast, which measured at about ten times a ZeroMQ hop (docs/benchmarks.md history,
"Tensor-parallel plan hop"). A rank
that dies is the executor dying: rank 0 sees it (a failed collective, the child's exit or
another node's lost link within a poll turn), stops the others and exits 1, so the scheduler fails the in-flight
requests and `folio serve` starts a fresh group, which says hello again; the new rank 0
waits in the rendezvous until the other nodes' ranks (restarted by their node) rejoin.
Rank 0 dying takes the children with it (PR_SET_PDEATHSIG).
"""

from __future__ import annotations

import dataclasses
import json
import logging
import os
import signal
import subprocess
import sys
import time

from folio.executor.parallel.nodes import NodeLayout, choose_interface, rendezvous_address
from folio.shared.config import EngineConfig
from folio.shared.cpus import usable_cores

log = logging.getLogger("folio.executor")

STOP_GRACE_S = 3.0
JOIN_TIMEOUT_S = 120.0   # past the rendezvous, the other nodes' ranks connect within moments


class RankDied(RuntimeError):
    pass


def rank_cores(cores: list[int], size: int, rank: int) -> tuple[int, ...]:
    """An equal share of this executor's cores per rank (all of them when fewer than N)."""
    if len(cores) < size:
        return tuple(cores)
    share = len(cores) // size
    return tuple(cores[rank * share:(rank + 1) * share])


def backend_of(engine: EngineConfig) -> str:
    import torch

    cuda = engine.device == "cuda" or (engine.device == "auto" and torch.cuda.is_available())
    return "nccl" if cuda else "gloo"


class RankGroup:
    """Rank 0's view of the group: the child ranks' processes and the torch group."""

    def __init__(self, engine: EngineConfig, curve_keys: str | None = None) -> None:
        """`curve_keys`: the keys directory the hop to other nodes authenticates with."""
        from folio.executor.parallel.sharding import TensorParallel, TPConfig

        size = engine.tensor_parallel_size
        layout = NodeLayout.of(engine)
        if layout.nnodes > 1:
            choose_interface(engine.master_addr)   # inherited by the children
        cores = usable_cores()
        address = rendezvous_address(engine)
        backend = backend_of(engine)
        if backend == "nccl":
            import torch

            if torch.cuda.device_count() < layout.per_node:
                raise ValueError(f"tensor_parallel_size {size} over {layout.nnodes} nodes "
                                 f"needs {layout.per_node} GPUs on each; this host has "
                                 f"{torch.cuda.device_count()}")
        local = layout.ranks_on(0)[1:]
        self.plans = PlanSender(local)
        self.remote = None
        self.children: dict[int, subprocess.Popen] = {}
        try:
            if layout.remote_ranks:
                from folio.executor.parallel.links import RemotePlans

                self.remote = RemotePlans(engine, layout.remote_ranks, curve_keys)
            for rank in local:
                self.children[rank] = spawn_rank(rank, address, backend, engine, cores,
                                                 self.plans.addresses[rank])
            if hasattr(os, "sched_setaffinity"):
                os.sched_setaffinity(0, rank_cores(cores, layout.per_node, 0))
            self.engine = _rank_engine(engine, cores, layout.per_node)
            if self.remote is not None:   # the wait may be long: say for whom
                log.info("tensor parallel: waiting at %s for ranks %d..%d of nodes 1..%d "
                         "(`folio executor --headless`)", address, layout.per_node, size - 1,
                         layout.nnodes - 1)
            self.tp = TensorParallel(TPConfig(size, 0, address, backend))
            if self.remote is not None:
                self.remote.wait_joined(JOIN_TIMEOUT_S, self.check)
        except Exception:
            self.stop()
            raise
        log.info("tensor parallel: %d ranks on %s (pids %s)%s", size, backend,
                 ", ".join(str(pid) for pid in self.pids),
                 f" over {layout.nnodes} nodes" if layout.nnodes > 1 else "")

    @property
    def pids(self) -> tuple[int, ...]:
        """The other ranks' pids, rank 1 first (another node's: on that node)."""
        pids = {rank: proc.pid for rank, proc in self.children.items()}
        if self.remote is not None:
            pids.update(self.remote.pids)
        return tuple(pids[rank] for rank in sorted(pids))

    def check(self) -> None:
        """RankDied when a child rank has exited."""
        for rank, proc in self.children.items():
            code = proc.poll()
            if code is not None:
                raise RankDied(f"tensor-parallel rank {rank} exited with {code}")
        lost = self.remote.down() if self.remote is not None else None
        if lost is not None:
            raise RankDied(lost)

    def dead_rank(self, wait_s: float) -> str | None:
        """Which child rank exited (waiting up to `wait_s` for one to), or None."""
        deadline = time.monotonic() + wait_s
        while True:
            try:
                self.check()
            except RankDied as error:
                return str(error)
            if time.monotonic() >= deadline:
                return None
            time.sleep(0.05)

    def send(self, data: bytes) -> None:
        """One scheduler message (a plan or a reset) to every other rank."""
        self.plans.send(data)
        if self.remote is not None:
            try:
                self.remote.send(data)
            except ConnectionError as error:
                raise RankDied(str(error)) from None

    def stop(self) -> None:
        self.plans.close()
        if self.remote is not None:
            self.remote.close()
            self.remote = None
        for proc in self.children.values():
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
        for proc in self.children.values():
            try:
                proc.wait(timeout=STOP_GRACE_S)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()


class PlanSender:
    """Rank 0's end of the plan hop on its own node: one PUSH socket per other rank there
    (PUSH queues until its rank connects, so nothing sent early is lost)."""

    def __init__(self, ranks: range) -> None:
        import zmq

        from folio.shared.transport import configure, ipc_address, make_run_dir

        self.run_dir = make_run_dir()
        self.ctx = zmq.Context()
        self.addresses = {rank: ipc_address(self.run_dir, f"rank-{rank}")
                          for rank in ranks}
        self.socks = []
        for address in self.addresses.values():
            sock = configure(self.ctx.socket(zmq.PUSH))
            sock.bind(address)
            self.socks.append(sock)

    def send(self, data: bytes) -> None:
        for sock in self.socks:
            sock.send(data, copy=False)

    def close(self) -> None:
        import shutil

        for sock in self.socks:
            sock.close(0)
        self.ctx.term()
        shutil.rmtree(self.run_dir, ignore_errors=True)


def _rank_engine(engine: EngineConfig, cores: list[int], size: int) -> EngineConfig:
    """The engine a rank runs: threads for its share of the cores unless given."""
    if engine.cpu_threads is not None:
        return engine
    return dataclasses.replace(engine, cpu_threads=max(1, len(cores) // size))


def spawn_rank(rank: int, address: str, backend: str, engine: EngineConfig, cores: list[int],
               plans: str, curve_keys: str | None = None) -> subprocess.Popen:
    """Start `rank` of this node on its share of the node's `cores`; `plans`: where it
    receives rank 0's messages (ipc:// on rank 0's node, tcp:// on another)."""
    layout = NodeLayout.of(engine)
    return _spawn(rank, layout.size, address, backend,
                  _rank_engine(engine, cores, layout.per_node),
                  rank_cores(cores, layout.per_node, layout.local_index(rank)), plans,
                  curve_keys or "")


def _spawn(rank: int, size: int, address: str, backend: str, engine: EngineConfig,
           cores: tuple[int, ...], plans: str, curve_keys: str) -> subprocess.Popen:
    def before_exec() -> None:
        try:
            import ctypes

            ctypes.CDLL(None).prctl(1, signal.SIGTERM, 0, 0, 0)   # PR_SET_PDEATHSIG
        except (OSError, AttributeError):
            pass
        if hasattr(os, "sched_setaffinity") and cores:
            os.sched_setaffinity(0, cores)

    config = json.dumps(dataclasses.asdict(engine))
    return subprocess.Popen([sys.executable, "-m", "folio.executor.parallel.group", str(rank), str(size),
                             address, backend, plans, config, curve_keys],
                            preexec_fn=before_exec)


def run_rank(rank: int, size: int, address: str, backend: str, plans: str,
             engine: EngineConfig, curve_keys: str | None = None) -> None:
    """A child rank: join the group, build its share of the model, then apply every
    message rank 0 passes on until the group ends."""
    from folio.executor.executor import Executor
    from folio.executor.parallel.sharding import TensorParallel, TPConfig
    from folio.shared.protocol import messages as m
    if plans.startswith("ipc://"):
        import zmq

        from folio.shared.transport import configure

        link = configure(zmq.Context().socket(zmq.PULL))
        link.connect(plans)
    else:   # another node than rank 0's
        from folio.executor.parallel.links import PlanReceiver

        link = PlanReceiver(plans, rank, engine, curve_keys)
    tp = TensorParallel(TPConfig(size, rank, address, backend,
                                 NodeLayout.of(engine).local_index(rank)))
    executor = Executor(engine, tp)
    while True:
        msg_type, body = m.decode(link.recv(), m.RANK0_TO_RANKS)
        if msg_type == "plan":
            executor.execute(m.decode_plan(body))
        else:
            executor.reset()


def main(argv: list[str]) -> int:
    rank, size, address, backend, plans, config, curve_keys = argv
    logging.basicConfig(level=os.environ.get("FOLIO_LOG_LEVEL", "INFO"),
                        format=f"%(asctime)s folio-executor-rank{rank} %(levelname)s "
                        "%(message)s")
    try:
        import setproctitle

        setproctitle.setproctitle(f"folio-executor-rank{rank}")
    except ImportError:
        pass
    try:
        run_rank(int(rank), int(size), address, backend, plans,
                 EngineConfig(**json.loads(config)), curve_keys or None)
    except Exception as error:   # a failed collective: rank 0 or a peer is gone
        log.error("rank %s stops: %s", rank, error)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
