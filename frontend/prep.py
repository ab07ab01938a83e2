"""Heavy per-request work off the event loop: chat templates, tokenizing, decoding large
client messages, building stop-string tables.

Small inputs are prepared inline (a thread hop would cost more than the work). Large ones go
to a small thread pool with a bounded number of jobs in it; a caller beyond the bound waits
for a slot (the ZeroMQ gateway stops reading meanwhile, so its socket queues the rest), and
the event loop keeps serving streams, heartbeats and small requests all the while.
"""

from __future__ import annotations

import asyncio
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any, Callable


@dataclass(frozen=True)
class PrepConfig:
    workers: int = 2
    max_jobs: int = 16           # queued or running in the pool
    inline_chars: int = 16_384   # inputs up to this size are prepared on the loop


class Preparer:
    def __init__(self, config: PrepConfig = PrepConfig()) -> None:
        self.config = config
        self.pool = ThreadPoolExecutor(config.workers, thread_name_prefix="folio-prep")
        self.slots: asyncio.Semaphore | None = None   # made in the running loop

    def small(self, size: int) -> bool:
        return size <= self.config.inline_chars

    async def reserve(self) -> None:
        """Wait for a slot in the pool; pair with submit()."""
        if self.slots is None:
            self.slots = asyncio.Semaphore(self.config.max_jobs)
        await self.slots.acquire()

    def submit(self, fn: Callable[..., Any], *args: Any) -> asyncio.Future:
        """Run fn in the pool (after reserve()); the slot is freed when it ends."""
        loop = asyncio.get_running_loop()
        job = self.pool.submit(fn, *args)
        job.add_done_callback(lambda _: self._release(loop))
        return asyncio.wrap_future(job)

    def _release(self, loop: asyncio.AbstractEventLoop) -> None:
        try:
            loop.call_soon_threadsafe(self.slots.release)
        except RuntimeError:   # the loop closed at shutdown
            pass

    async def run(self, size: int, fn: Callable[..., Any], *args: Any) -> Any:
        """fn(*args): inline when `size` is small, else in the pool."""
        if self.small(size):
            return fn(*args)
        await self.reserve()
        return await self.submit(fn, *args)

    def close(self) -> None:
        self.pool.shutdown(wait=False, cancel_futures=True)
