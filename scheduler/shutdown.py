"""The graceful stop of the scheduler process: the first SIGTERM/SIGINT starts a drain (new
requests are refused, running ones may finish within the shutdown timeout), the second one
stops at once. Pure state: the service refuses, fails and closes."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable

log = logging.getLogger("folio.scheduler")


class ShutdownDrain:
    def __init__(self, timeout_s: float, clock: Callable[[], float] = time.monotonic) -> None:
        self.timeout_s = timeout_s
        self.clock = clock
        self.since: float | None = None   # when the drain began; None: serving
        self.stopping = False             # leave the loop now

    @property
    def draining(self) -> bool:
        return self.since is not None

    def on_signal(self, num_running: int) -> None:
        if self.since is None:
            log.info("draining: refusing new requests, %d running may finish within %.0f s",
                     num_running, self.timeout_s)
            self.since = self.clock()
        else:
            self.stopping = True

    def is_over(self, num_running: int) -> bool:
        """Draining, and nothing runs any more or the timeout has passed (the service then
        fails what still runs, and stops)."""
        if self.since is None:
            return False
        return not num_running or self.clock() - self.since >= self.timeout_s
