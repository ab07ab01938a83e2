"""The ranks of a tensor-parallel executor: rank 0 is the `folio executor` process (the one
the scheduler talks to); it starts ranks 1..N-1 as child processes on this host and joins
them in one torch.distributed group (gloo on CPU, NCCL on CUDA, rank r on GPU r).

Each scheduler message that changes state (a plan, a reset) is passed on by rank 0, as the
same bytes, to the others, which apply it in the same order: the scheduler sends once per
step. The hop is a ZeroMQ PUSH per rank on ipc:// sockets in a private directory, not a
gloo broadcast, which measured at about ten times a ZeroMQ hop (docs/benchmarks.md history,
"Tensor-parallel plan hop"). A rank
that dies is the executor dying: rank 0 sees it (a failed collective, or the child's exit
within a poll turn), stops the others and exits 1, so the scheduler fails the in-flight
requests and `folio serve` starts a fresh group, which says hello again. Rank 0 dying takes
the children with it (PR_SET_PDEATHSIG).
"""

from __future__ import annotations

import dataclasses
import json
import logging
import os
import signal
import socket
import subprocess
import sys
import time

from folio.shared.config import EngineConfig
from folio.shared.cpus import usable_cores

log = logging.getLogger("folio.executor")

STOP_GRACE_S = 3.0


class RankDied(RuntimeError):
    pass


def rank_cores(cores: list[int], size: int, rank: int) -> tuple[int, ...]:
    """An equal share of this executor's cores per rank (all of them when fewer than N)."""
    if len(cores) < size:
        return tuple(cores)
    share = len(cores) // size
    return tuple(cores[rank * share:(rank + 1) * share])


def _backend(engine: EngineConfig) -> str:
    import torch

    cuda = engine.device == "cuda" or (engine.device == "auto" and torch.cuda.is_available())
    return "nccl" if cuda else "gloo"


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


class RankGroup:
    """Rank 0's view of the group: the child ranks' processes and the torch group."""

    def __init__(self, engine: EngineConfig) -> None:
        from folio.executor.parallel import TensorParallel, TPConfig

        size = engine.tensor_parallel_size
        cores = usable_cores()
        address = f"tcp://127.0.0.1:{_free_port()}"
        self.plans = PlanSender(size)
        backend = _backend(engine)
        if backend == "nccl":
            import torch

            if torch.cuda.device_count() < size:
                raise ValueError(f"tensor_parallel_size {size} needs {size} GPUs; this host "
                                 f"has {torch.cuda.device_count()}")
        self.children: dict[int, subprocess.Popen] = {}
        for rank in range(1, size):
            self.children[rank] = _spawn(rank, size, address, backend,
                                         _rank_engine(engine, cores, size),
                                         rank_cores(cores, size, rank),
                                         self.plans.addresses[rank])
        if hasattr(os, "sched_setaffinity"):
            os.sched_setaffinity(0, rank_cores(cores, size, 0))
        self.engine = _rank_engine(engine, cores, size)
        try:
            self.tp = TensorParallel(TPConfig(size, 0, address, backend))
        except Exception:
            self.stop()
            raise
        log.info("tensor parallel: %d ranks on %s (pids %s)", size, backend,
                 ", ".join(str(p.pid) for p in self.children.values()))

    @property
    def pids(self) -> tuple[int, ...]:
        """The child ranks' pids, rank 1 first."""
        return tuple(self.children[rank].pid for rank in sorted(self.children))

    def check(self) -> None:
        """RankDied when a child rank has exited."""
        for rank, proc in self.children.items():
            code = proc.poll()
            if code is not None:
                raise RankDied(f"tensor-parallel rank {rank} exited with {code}")

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

    def stop(self) -> None:
        self.plans.close()
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
    """Rank 0's end of the plan hop: one PUSH socket per other rank (PUSH queues until its
    rank connects, so nothing sent early is lost)."""

    def __init__(self, size: int) -> None:
        import zmq

        from folio.shared.transport import configure, ipc_address, make_run_dir

        self.run_dir = make_run_dir()
        self.ctx = zmq.Context()
        self.addresses = {rank: ipc_address(self.run_dir, f"rank-{rank}")
                          for rank in range(1, size)}
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


def _spawn(rank: int, size: int, address: str, backend: str, engine: EngineConfig,
           cores: tuple[int, ...], plans: str) -> subprocess.Popen:
    def before_exec() -> None:
        try:
            import ctypes

            ctypes.CDLL(None).prctl(1, signal.SIGTERM, 0, 0, 0)   # PR_SET_PDEATHSIG
        except (OSError, AttributeError):
            pass
        if hasattr(os, "sched_setaffinity") and cores:
            os.sched_setaffinity(0, cores)

    config = json.dumps(dataclasses.asdict(engine))
    return subprocess.Popen([sys.executable, "-m", "folio.executor.tp_group", str(rank), str(size),
                             address, backend, plans, config], preexec_fn=before_exec)


def run_rank(rank: int, size: int, address: str, backend: str, plans: str,
             engine: EngineConfig) -> None:
    """A child rank: join the group, build its share of the model, then apply every
    message rank 0 passes on until the group ends."""
    import zmq

    from folio.executor.executor import Executor
    from folio.executor.parallel import TensorParallel, TPConfig
    from folio.shared import messages as m
    from folio.shared.transport import configure

    ctx = zmq.Context()
    pull = configure(ctx.socket(zmq.PULL))
    pull.connect(plans)
    tp = TensorParallel(TPConfig(size, rank, address, backend))
    executor = Executor(engine, tp)
    while True:
        msg_type, body = m.decode(pull.recv(), m.RANK0_TO_RANKS)
        if msg_type == "plan":
            executor.execute(m.decode_plan(body))
        else:
            executor.reset()


def main(argv: list[str]) -> int:
    rank, size, address, backend, plans, config = argv
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
                 EngineConfig(**json.loads(config)))
    except Exception as error:   # a failed collective: rank 0 or a peer is gone
        log.error("rank %s stops: %s", rank, error)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
