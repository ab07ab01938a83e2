"""The string codes that cross the wire: why a request finished, why one was refused.

Both are `StrEnum`s: a member is a `str` equal to its value, so it packs to the same
msgpack bytes as the bare string, compares equal to it, formats as it and, so that
outputs (folio.LLM's RequestOutput) print as they did, shows as it in repr().
docs/protocol.md documents every value (tests/shared/protocol/test_doc.py checks).
"""

from __future__ import annotations

from enum import StrEnum


class FinishReason(StrEnum):
    __repr__ = str.__repr__
    STOP = "stop"        # EOS, a stop token or a stop string
    LENGTH = "length"    # max_tokens or the context limit
    ABORT = "abort"      # cancelled by the client or the server
    ERROR = "error"      # the engine failed the request


class RefusalCode(StrEnum):
    """`rejected.code` (scheduler -> frontend) and `error.code` (frontend -> client)."""

    __repr__ = str.__repr__

    INVALID = "invalid"                # malformed, or can never be served as asked
    REJECTED = "rejected"              # the scheduler's own checks (id in use, limits)
    QUEUE_FULL = "queue_full"          # admission: the waiting queue is full; retry later
    ENGINE_DEAD = "engine_dead"        # no scheduler or no executor; the request failed
    SHUTTING_DOWN = "shutting_down"    # draining after SIGTERM
    TIMEOUT = "timeout"                # the request's deadline passed; it was aborted
    # The client fell too far behind reading: an HTTP stream (429), or an SDK connection
    # whose reply queue filled (its requests were aborted; told when it reads again).
    SLOW_READER = "slow_reader"
    # This request alone failed in a step (its logits, e.g. from its own LoRA adapter, were
    # not finite; its grammar ran past its budget): the engine goes on serving the others.
    REQUEST_FAILED = "request_failed"


def refusal_code(value: str) -> RefusalCode | str:
    """The member for a known code; an unknown one (a newer peer's) stays a plain string."""
    try:
        return RefusalCode(value)
    except ValueError:
        return value
