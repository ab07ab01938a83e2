"""Where `folio serve` puts its three processes on the machine's cores.

When the executor computes on the CPU it runs one OpenMP thread per core it owns; a core
that it shares with the frontend or the scheduler stalls the whole step whenever they wake
(OpenMP barriers wait for the slowest thread). A core of their own avoids that, but the
control processes need a small part of one (about 0.1 core at 400 tokens/s): on a machine
with few cores, the reserved core costs more than the stalls do. Measured on 2 cores
(`bench/serve.py variants`, docs/benchmarks.md): shared made 1.3-1.6x split's output tokens/s.

Policies (`folio serve --cpu-placement`):
- split:  frontend and scheduler on the last usable core, the executor on the others
- shared: the executor on every usable core, the control processes wherever the OS puts them
- off:    no affinity at all (threads: one per core the executor may use)
- auto:   on CPU, shared below SPLIT_MIN_CORES usable cores and split from there; off
          with a GPU
"""

from __future__ import annotations

import os
import shutil
from dataclasses import dataclass


PLACEMENTS = ("auto", "split", "shared", "off")
# From this many usable cores a core of their own for the control processes costs at most a
# quarter of the executor's; below it, sharing wins (measured on 2 cores, not on 4+).
SPLIT_MIN_CORES = 4


@dataclass(frozen=True)
class Placement:
    policy: str                               # the policy applied (auto resolved)
    executor_cores: tuple[int, ...] | None    # None: leave the affinity as inherited
    control_cores: tuple[int, ...] | None     # frontend and scheduler

    def cores_for(self, role: str) -> tuple[int, ...] | None:
        return self.executor_cores if role == "executor" else self.control_cores

    def describe(self) -> str:
        if self.executor_cores is None and self.control_cores is None:
            return f"{self.policy}: no CPU pinning"
        control = "any core" if self.control_cores is None else _cores(self.control_cores)
        return (f"{self.policy}: executor on {_cores(self.executor_cores or ())}, "
                f"frontend and scheduler on {control}")


def plan_placement(policy: str, cores: list[int], executor_on_cpu: bool) -> Placement:
    if policy not in PLACEMENTS:
        raise ValueError(f"cpu_placement must be one of {', '.join(PLACEMENTS)}; "
                         f"got {policy!r}")
    if policy == "auto":
        if not executor_on_cpu:
            policy = "off"
        else:
            policy = "split" if len(cores) >= SPLIT_MIN_CORES else "shared"
    cores = sorted(cores)
    if policy == "off":
        return Placement("off", None, None)
    if policy == "shared" or len(cores) < 2:
        return Placement(policy, tuple(cores), None)
    return Placement("split", tuple(cores[:-1]), (cores[-1],))


def executor_runs_on_cpu(device: str) -> bool:
    """Without importing torch: is there a GPU the executor would pick?"""
    if device != "auto":
        return device == "cpu"
    return not (os.path.exists("/dev/nvidiactl") or shutil.which("nvidia-smi"))


def pin(cores: tuple[int, ...] | None) -> None:
    """Restrict the calling process (before exec: the child to be) to `cores`."""
    if cores is not None and hasattr(os, "sched_setaffinity"):
        os.sched_setaffinity(0, cores)


def _cores(cores: tuple[int, ...]) -> str:
    return ("core " if len(cores) == 1 else "cores ") + ",".join(map(str, cores))
