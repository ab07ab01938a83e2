"""CPU-only scheduling and KV-block bookkeeping. Never imports torch."""

from folio.scheduler.scheduler import Scheduler

__all__ = ["Scheduler"]
