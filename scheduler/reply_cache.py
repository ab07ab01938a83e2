"""One encoded answer shared by every request for it within a short age: a flood of stats
or page-map requests (health checks, scrapes, open dashboards) costs one walk of the
scheduler's state per interval, not one per request."""

from __future__ import annotations

import time
from collections.abc import Callable


class CachedReply:
    def __init__(self, max_age_s: float, clock: Callable[[], float] = time.monotonic) -> None:
        self.max_age_s = max_age_s
        self.clock = clock
        # (when, source, version, answer)
        self._cached: tuple[float, object, int, bytes] | None = None

    def get(self, source: object, build: Callable[[], bytes], version: int = 0) -> bytes:
        """The answer built within max_age_s from this same `source` (the Scheduler, or
        None without an executor) at this same `version`, else a fresh one: a new or lost
        executor is seen at once, and so is whatever bumps the version (the service passes
        the count of finished requests, so a client that got its answer and then asks sees
        its request counted)."""
        now = self.clock()
        cached = self._cached
        if (cached is None or now - cached[0] > self.max_age_s or cached[1] is not source
                or cached[2] != version):
            cached = self._cached = (now, source, version, build())
        return cached[3]
