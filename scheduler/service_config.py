"""`folio scheduler`'s settings, apart from the service itself: every command's parser
and checks read them (folio/command_settings.py, folio/checks.py), and the frontend and
executor processes need not import the scheduler to parse their own flags."""

from __future__ import annotations

from dataclasses import MISSING, dataclass

from folio.shared.config import SchedulingPolicy
from folio.shared.kv_events_config import kv_events_problem
from folio.shared.service_settings import ShutdownSettings, TransportSettings
from folio.shared.settings import above, optional, positive_int, setting


def an_address(value: str) -> str | None:
    return None if value else "must be an address, e.g. ipc:///run/folio/x.sock"


@dataclass(frozen=True, kw_only=True)
class SchedulerServiceConfig(SchedulingPolicy, TransportSettings, ShutdownSettings):
    """The scheduling policy (shared with EngineConfig), the link and shutdown settings every
    process has, and this process's own; `folio scheduler`'s flags are generated from these
    fields, and SchedulingPolicy's __post_init__ runs every field's declared check."""

    frontend_address: str = setting(MISSING, "where frontends connect (this process binds it)",
                                     check=an_address)
    executor_address: str = setting(MISSING, "where the executor connects (this process "
                                    "binds it)", check=an_address)
    max_queued_requests: int | None = setting(
        None, "refuse new requests (queue full) past this many waiting, not counting those "
        "that free running seats (max-num-seqs) will take (default: no limit)",
        check=optional(positive_int))
    max_queued_tokens: int | None = setting(
        None, "... or past this many prompt tokens waiting (default: no limit)",
        check=optional(positive_int))
    executor_timeout_s: float = setting(
        2.0, "seconds without an executor heartbeat before it is dead", "executor-timeout",
        check=above(0, " seconds"))
    step_timeout_s: float = setting(
        60.0, "seconds a step may take before the executor is declared hung", "step-timeout",
        check=above(0, " seconds"))
    kv_events_config: str | None = setting(
        None, "publish the prefix cache's changes as vLLM's KV events: JSON with vLLM's "
        "KVEventsConfig keys, e.g. '{\"enable_kv_cache_events\": true, \"publisher\": "
        "\"zmq\", \"endpoint\": \"tcp://127.0.0.1:5557\", \"replay_endpoint\": "
        "\"tcp://127.0.0.1:5558\"}' (default: none published)", metavar="JSON",
        check=kv_events_problem)
    async_scheduling: bool = setting(
        True, "keep one step in flight: send the plan of step N+1 before the result of "
        "step N arrives, hiding the hop")
