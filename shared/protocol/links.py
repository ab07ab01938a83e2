"""The links a message can cross: one name per direction of each socket pair (the rows of
docs/protocol.md §2). Each message declaration names the links that carry it."""

from __future__ import annotations

from enum import StrEnum


class Link(StrEnum):
    CLIENT_TO_GATEWAY = "client -> frontend"
    GATEWAY_TO_CLIENT = "frontend -> client"
    FRONTEND_TO_SCHEDULER = "frontend -> scheduler"
    SCHEDULER_TO_FRONTEND = "scheduler -> frontend"
    # The frontend's heartbeat socket (frontend/liveness.py): the scheduler's answers.
    SCHEDULER_TO_FRONTEND_HEARTBEAT = "scheduler -> frontend heartbeat"
    EXECUTOR_TO_SCHEDULER = "executor -> scheduler"
    SCHEDULER_TO_EXECUTOR = "scheduler -> executor"
    # Tensor parallelism: rank 0 passes each plan and reset on, as the same bytes.
    RANK0_TO_RANKS = "executor rank 0 -> ranks"
