"""Every message type, and which types each socket accepts: the one list of both.

A receiver passes its link's set to `shared.messages.decode`, which refuses any other type.
docs/protocol.md §2 has the same table; tests/shared/test_protocol_doc.py checks that every type
here is documented and that every encoder packs a type of some link.
"""

from __future__ import annotations

from enum import StrEnum


class MessageType(StrEnum):
    # client (SDK) <-> frontend gateway
    GENERATE = "generate"
    DELTA = "delta"
    FINAL = "final"
    ERROR = "error"
    HEALTH = "health"            # request and reply
    KV_MAP = "kv_map"            # request and reply, here and scheduler -> frontend
    ABORT = "abort"              # client -> frontend and frontend -> scheduler
    # frontend <-> scheduler
    FRONTEND_HELLO = "frontend_hello"
    ADD = "add"
    STATS_REQUEST = "stats_request"
    KV_MAP_REQUEST = "kv_map_request"
    HEARTBEAT = "heartbeat"      # frontend or executor -> scheduler, and the scheduler's reply
    ENGINE_INFO = "engine_info"
    OUTPUTS = "outputs"
    REJECTED = "rejected"
    STATS = "stats"
    FRONTEND_DROPPED = "frontend_dropped"
    # scheduler <-> executor
    EXECUTOR_HELLO = "executor_hello"
    RESULT = "result"
    EXECUTOR_ERROR = "executor_error"
    PLAN = "plan"
    RESET = "reset"
    PING = "ping"


T = MessageType

CLIENT_TO_GATEWAY = frozenset({T.GENERATE, T.ABORT, T.HEALTH, T.KV_MAP})
GATEWAY_TO_CLIENT = frozenset({T.DELTA, T.FINAL, T.ERROR, T.HEALTH, T.KV_MAP})
FRONTEND_TO_SCHEDULER = frozenset({T.FRONTEND_HELLO, T.ADD, T.ABORT, T.STATS_REQUEST,
                                   T.KV_MAP_REQUEST, T.HEARTBEAT})
SCHEDULER_TO_FRONTEND = frozenset({T.ENGINE_INFO, T.OUTPUTS, T.REJECTED, T.STATS, T.KV_MAP,
                                   T.FRONTEND_DROPPED})
# The frontend's heartbeat socket (frontend/liveness.py): the scheduler's answers.
SCHEDULER_TO_FRONTEND_HEARTBEAT = frozenset({T.HEARTBEAT})
EXECUTOR_TO_SCHEDULER = frozenset({T.EXECUTOR_HELLO, T.RESULT, T.EXECUTOR_ERROR, T.HEARTBEAT})
SCHEDULER_TO_EXECUTOR = frozenset({T.PLAN, T.RESET, T.PING})
# Tensor parallelism: rank 0 passes each plan and reset on, as the same bytes.
RANK0_TO_RANKS = frozenset({T.PLAN, T.RESET})

LINKS = (("client -> frontend", CLIENT_TO_GATEWAY), ("frontend -> client", GATEWAY_TO_CLIENT),
         ("frontend -> scheduler", FRONTEND_TO_SCHEDULER),
         ("scheduler -> frontend", SCHEDULER_TO_FRONTEND),
         ("scheduler -> frontend heartbeat", SCHEDULER_TO_FRONTEND_HEARTBEAT),
         ("executor -> scheduler", EXECUTOR_TO_SCHEDULER),
         ("scheduler -> executor", SCHEDULER_TO_EXECUTOR),
         ("executor rank 0 -> ranks", RANK0_TO_RANKS))
ALL_TYPES = frozenset().union(*(types for _, types in LINKS))
