"""The scheduler process's own admission rule: bounded queues. What can never fit is
refused by `Scheduler.add_request` itself (as in the offline engine); this only says when
the queue of waiting requests is too long to take one more.

A request that a free running seat (max_num_seqs) will take at the next step is not
queued behind anyone: the request limit counts the waiting requests past the free seats,
so a burst that arrives in one read (before any step) gets as many accepted as one that
trickles in."""

from __future__ import annotations

from collections.abc import Collection
from dataclasses import dataclass

from folio.scheduler.request import Request
from folio.shared.protocol.codes import RefusalCode


@dataclass(frozen=True)
class QueueLimits:
    max_requests: int | None = None   # waiting requests; None: no limit
    max_tokens: int | None = None     # prompt tokens of the waiting requests; None: no limit


def queue_refusal(limits: QueueLimits, waiting: Collection[Request],
                  prompt_len: int, free_seats: int = 0) -> tuple[str, str] | None:
    """(message, code) when a request of `prompt_len` tokens must be refused because the
    queue is full, by requests (past `free_seats`) or by prompt tokens; None: accept it."""
    limit = limits.max_requests
    if limit is not None and len(waiting) - max(0, free_seats) >= limit:
        return (f"the queue is full ({limit} requests waiting); retry later",
                RefusalCode.QUEUE_FULL)
    token_limit = limits.max_tokens
    if token_limit is not None:
        queued = sum(r.num_tokens for r in waiting)
        if queued + prompt_len > token_limit:
            return (f"the queue is full ({queued} prompt tokens waiting, limit "
                    f"{token_limit}); retry later", RefusalCode.QUEUE_FULL)
    return None
