"""Every setting of every `folio` command, declared once.

The settings of the engine (shared/config.py), of the scheduler process
(scheduler/service.py) and of the processes around them (shared/service_settings.py) are
declared beside the code that uses them; the few only the command line has (which model,
the roles' addresses, `folio serve`'s supervision, logging, `keys` and `probe`) are
declared here. COMMANDS says which groups each command takes: the parser (folio/cli.py)
and docs/configuration.md (folio/settings_doc.py) are generated from it.
"""

from __future__ import annotations

from dataclasses import MISSING, dataclass, field
from typing import Any

from folio.placement import PLACEMENTS
from folio.scheduler.service_config import SchedulerServiceConfig
from folio.planner.command import PlanSettings
from folio.planner.simulator.command import SimulateSettings
from folio.shared.config import EngineConfig, SchedulingPolicy
from folio.shared.service_settings import (ClientLimitSettings, FrontendLinks, HttpSettings,
                                           ShutdownSettings, TransportSettings)
from folio.shared.settings import Checked, non_negative_int, positive_int, setting

ROLES = ("frontend", "scheduler", "executor")
LOG_LEVELS = ("DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL")
MODEL_HELP = "checkpoint directory (default: the built-in model)"

# Read from the environment by the code that needs it, with no flag (none is generated).
ENVIRONMENT_ONLY = {
    "FOLIO_ALLOW_WILDCARD": ("unset", "1 allows binding every interface (tcp://*, 0.0.0.0, [::] "
                             "however written, or a name resolving to one), refused "
                             "otherwise; compose sets it inside its containers"),
}


@dataclass(frozen=True, kw_only=True)
class LogSettings(Checked):
    log_level: str = setting("INFO", "how much each process logs (before or after the "
                             "subcommand)", kind=str.upper, choices=LOG_LEVELS)


@dataclass(frozen=True, kw_only=True)
class ServeSettings(Checked):
    """What `folio serve` alone decides: the model, where clients connect, how it
    supervises its processes and where they run."""

    model: str | None = setting(None, MODEL_HELP)
    zmq_address: str | None = setting(
        None, "where clients connect (default: ipc:// socket in a private run directory), "
        "e.g. tcp://127.0.0.1:5555")
    executor_restarts: int = setting(
        3, "restart a crashed executor this many times, then exit non-zero",
        check=non_negative_int)
    data_parallel_size: int = setting(
        1, "replicas: scheduler+executor pairs, each with its own KV pool, that the "
        "frontend routes requests to (by prefix, then load)", check=positive_int)
    cpu_placement: str = setting(
        "auto", "which cores each process may use when the executor runs on CPU: split "
        "(frontend and scheduler on one core of their own), shared, off; auto: split on "
        "CPU, off with a GPU", choices=PLACEMENTS)
    headless: bool = setting(
        False, "a worker node of a multi-node group, as vLLM's `serve --headless`: run this "
        "node's tensor-parallel ranks only (node-rank > 0 of nnodes), no scheduler or "
        "frontend; the same as `folio executor --headless`")


@dataclass(frozen=True, kw_only=True)
class ExecutorLinks(Checked):
    model: str | None = setting(None, MODEL_HELP)
    scheduler_address: str | None = setting(None, "the scheduler's executor address "
                                            "(required unless --headless)")
    headless: bool = setting(False, "run this node's tensor-parallel ranks only (node-rank "
                             "> 0 of nnodes): no scheduler link; they join node 0's group, "
                             "and rejoin whenever the group restarts")


@dataclass(frozen=True, kw_only=True)
class KeysSettings(Checked):
    curve_keys: str = setting(MISSING, "the keys directory (kept if it already holds keys)",
                              "dir", metavar="DIR", env="FOLIO_CURVE_KEYS")
    client: tuple[str, ...] = setting((), "also write and authorize the client keypair NAME "
                                      "(repeatable), e.g. one per SDK user", metavar="NAME",
                                      repeat=True)
    force: bool = setting(False, "replace existing keypairs")


@dataclass(frozen=True, kw_only=True)
class ProbeSettings(Checked):
    role: str = setting(MISSING, "the role to check", choices=ROLES, positional=True)
    address: str = setting(
        MISSING, "frontend: its http://.../health URL or its client address; scheduler and "
        "executor: the scheduler's frontend address (the executor is healthy when the "
        "scheduler has it attached)", positional=True)
    timeout: float = setting(3.0, "seconds to wait for an answer")


@dataclass(frozen=True)
class Group:
    """One config dataclass's fields as one command's arguments."""

    config: type
    skip: tuple[str, ...] = ()
    defaults: dict[str, Any] = field(default_factory=dict)   # this command's own defaults


@dataclass(frozen=True)
class Command:
    name: str
    help: str
    groups: tuple[Group, ...]


# The SchedulerServiceConfig fields `folio serve` takes from elsewhere: the policy comes
# with the engine's flags, addresses from the run directory, CURVE keys, the shutdown
# timeout and --insecure-transport from the groups every role shares.
SERVE_SCHEDULER_SKIP = (*SchedulingPolicy.__dataclass_fields__, "frontend_address",
                        "executor_address", "curve_keys", "shutdown_timeout_s",
                        "insecure_transport")

MAIN = (Group(LogSettings),)   # before the subcommand (every subcommand repeats it)

COMMANDS = (
    Command("serve", "start frontend, scheduler and executor", (
        Group(ServeSettings),
        Group(HttpSettings, defaults={"port": 8000}),
        Group(ClientLimitSettings),
        Group(SchedulerServiceConfig, skip=SERVE_SCHEDULER_SKIP),
        Group(ShutdownSettings),
        Group(TransportSettings),
        Group(EngineConfig, skip=("model",)))),
    Command("frontend", "run the tokenizing frontend", (
        Group(FrontendLinks),
        Group(HttpSettings),
        Group(ClientLimitSettings),
        Group(ShutdownSettings),
        Group(TransportSettings))),
    Command("scheduler", "run the CPU-only scheduler", (Group(SchedulerServiceConfig),)),
    Command("executor", "run the model executor", (
        Group(ExecutorLinks),
        Group(TransportSettings),
        Group(EngineConfig, skip=("model",)))),
    Command("keys", "write CURVE keypairs for `--curve-keys` (mode 0700)",
            (Group(KeysSettings),)),
    Command("probe", "health check for one role; exit 0 when healthy", (
        Group(ProbeSettings),
        Group(TransportSettings))),
    Command("simulate", "replay a request trace through the real scheduler: paged vs "
            "contiguous reservation", (Group(SimulateSettings),)),
    Command("plan", "capacity planner: `plan calibrate` measures this machine's engine; "
            "`plan --workload` predicts latency, throughput and KV memory",
            (Group(PlanSettings),)),
)
