"""--kv-events-config: the scheduler publishes the prefix cache's changes as vLLM's KV events
(scheduler/kv_event_publisher.py). The value is JSON with vLLM's KVEventsConfig keys, so a
vLLM deployment's setting carries over; an unknown key is refused by name."""

from __future__ import annotations

import json
from dataclasses import dataclass, replace
from typing import Any

# vLLM's keys and Folio's defaults. The endpoint defaults to loopback, not vLLM's
# tcp://*:5557: the events carry prompt token ids.
_DEFAULTS: dict[str, Any] = {
    "enable_kv_cache_events": False, "publisher": "null", "endpoint": "tcp://127.0.0.1:5557",
    "replay_endpoint": None, "buffer_steps": 10_000, "hwm": 100_000, "topic": "",
    "data_parallel_rank": None}
_PUBLISHERS = ("null", "zmq")


@dataclass(frozen=True)
class KVEventsConfig:
    enable_kv_cache_events: bool
    publisher: str                 # "zmq" publishes; "null" (vLLM's default) does not
    endpoint: str                  # the PUB socket this scheduler binds
    replay_endpoint: str | None    # the ROUTER socket that answers replay requests
    buffer_steps: int              # batches kept for replay
    hwm: int                       # the PUB socket's send high-water mark
    topic: str
    data_parallel_rank: int | None   # set by `folio serve` per replica

    @property
    def publishes(self) -> bool:
        return self.enable_kv_cache_events and self.publisher == "zmq"

    def for_replica(self, rank: int) -> KVEventsConfig:
        """Replica `rank`'s config: its own ports (the given ones + rank, as vLLM offsets
        them for data-parallel ranks) and its rank in every batch."""
        return replace(self, endpoint=_offset(self.endpoint, rank),
                       replay_endpoint=_offset(self.replay_endpoint, rank),
                       data_parallel_rank=rank)

    def to_json(self) -> str:
        return json.dumps({k: getattr(self, k) for k in _DEFAULTS})


def parse_kv_events_config(text: str) -> KVEventsConfig:
    """ValueError with a one-line reason for anything that is not a usable config."""
    try:
        value = json.loads(text)
    except ValueError as error:
        raise ValueError(f"is not JSON ({error})") from None
    if not isinstance(value, dict):
        raise ValueError("must be a JSON object")
    unknown = sorted(set(value) - set(_DEFAULTS))
    if unknown:
        raise ValueError(f"has unknown key(s) {', '.join(unknown)}; known: "
                         f"{', '.join(_DEFAULTS)}")
    config = KVEventsConfig(**{**_DEFAULTS, **value})
    _check(config)
    return config


def kv_events_problem(text: str | None) -> str | None:
    """The setting's declared check."""
    if text is None:
        return None
    try:
        parse_kv_events_config(text)
    except ValueError as error:
        return str(error)
    return None


def _check(config: KVEventsConfig) -> None:
    if not isinstance(config.enable_kv_cache_events, bool):
        raise ValueError("enable_kv_cache_events must be true or false")
    if config.publisher not in _PUBLISHERS:
        raise ValueError(f"publisher must be one of {', '.join(_PUBLISHERS)}")
    for key in ("endpoint", "topic"):
        if not isinstance(getattr(config, key), str):
            raise ValueError(f"{key} must be a string")
    if config.replay_endpoint is not None and not isinstance(config.replay_endpoint, str):
        raise ValueError("replay_endpoint must be a string or null")
    for key in ("buffer_steps", "hwm"):
        number = getattr(config, key)
        if isinstance(number, bool) or not isinstance(number, int) or number < 1:
            raise ValueError(f"{key} must be a positive integer")
    rank = config.data_parallel_rank
    if rank is not None and (isinstance(rank, bool) or not isinstance(rank, int) or rank < 0):
        raise ValueError("data_parallel_rank must be an integer >= 0")
    if config.publishes:
        from folio.shared.transport import check_bind_address

        for address in (config.endpoint, config.replay_endpoint):
            if address is not None:
                check_bind_address(address)
        if config.replay_endpoint == config.endpoint:
            raise ValueError("replay_endpoint must differ from endpoint")


def _offset(endpoint: str | None, rank: int) -> str | None:
    """tcp://host:port -> tcp://host:(port + rank); other transports get a suffix."""
    if endpoint is None or rank == 0:
        return endpoint
    head, _, port = endpoint.rpartition(":")
    if endpoint.startswith("tcp://") and port.isdigit():
        return f"{head}:{int(port) + rank}"
    return f"{endpoint}-{rank}"
