"""Where `folio serve` puts its three processes on the machine's cores.

When the executor computes on the CPU it runs one OpenMP thread per core it owns; a core
that it shares with the frontend or the scheduler stalls the whole step whenever they wake
(OpenMP barriers wait for the slowest thread). So on CPU the control processes get a core
of their own and the executor the rest; with a GPU nothing is pinned.

Policies (`folio serve --cpu-placement`):
- split:  frontend and scheduler on the last usable core, the executor on the others
- shared: the executor on every usable core, the control processes wherever the OS puts them
- off:    no affinity at all (threads: one per core the executor may use)
- auto:   split when the executor runs on CPU, off with a GPU
"""

from __future__ import annotations

import os
import shutil
from dataclasses import dataclass


PLACEMENTS = ("auto", "split", "shared", "off")


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
        policy = "split" if executor_on_cpu else "off"
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
