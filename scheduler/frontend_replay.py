"""What a frontend was sent lately, numbered, so a frontend whose link dropped can resume
its requests exactly: it names the last outputs message it read, and the ones after it are
sent again (docs/protocol.md §5, "Resuming after a dropped link").

Messages are kept for KEEP_S seconds and at most MAX_BYTES per frontend, the oldest going
first: a resume is asked within seconds of a drop, so only the last moments matter. A
resume from before what is kept cannot be exact, and is refused (its requests fail once)."""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field

KEEP_S = 15.0               # longer than a parked frontend is waited for
MAX_BYTES = 64 << 20        # per frontend


@dataclass
class _Stream:
    sent: int = 0   # the last message's number (the first is 1)
    # (number, when, message, the requests it ended)
    kept: deque[tuple[int, float, bytes, tuple[str, ...]]] = field(default_factory=deque)
    kept_bytes: int = 0


class OutputReplay:
    def __init__(self, clock: Callable[[], float] = time.monotonic, keep_s: float = KEEP_S,
                 max_bytes: int = MAX_BYTES) -> None:
        self.clock, self.keep_s, self.max_bytes = clock, keep_s, max_bytes
        self.streams: dict[str, _Stream] = {}   # frontend name -> its stream

    def next_seq(self, name: str) -> int:
        stream = self.streams.get(name)
        if stream is None:
            stream = self.streams[name] = _Stream()
        stream.sent += 1
        return stream.sent

    def keep(self, name: str, seq: int, payload: bytes, ended: tuple[str, ...] = ()) -> None:
        """Keep message `seq` (just numbered by next_seq) for a resume; `ended`: the
        requests whose last sample it ends."""
        stream = self.streams[name]
        now = self.clock()
        stream.kept.append((seq, now, payload, ended))
        stream.kept_bytes += len(payload)
        kept = stream.kept
        while kept and (kept[0][1] < now - self.keep_s or stream.kept_bytes > self.max_bytes):
            stream.kept_bytes -= len(kept.popleft()[2])

    def since(self, name: str, seq: int) -> tuple[list[bytes], set[str]] | None:
        """The messages after `seq` in order, and the requests they end; None when some of
        them are no longer kept."""
        stream = self.streams.get(name)
        if stream is None or seq >= stream.sent:
            return ([], set()) if stream is None or seq == stream.sent else None
        kept = stream.kept
        if not kept or kept[0][0] > seq + 1:
            return None
        after = [entry for entry in kept if entry[0] > seq]
        return [entry[2] for entry in after], {rid for entry in after for rid in entry[3]}
