"""The executor's CPU thread policy: one torch (OpenMP) thread per core it may run on.

`folio serve` decides which cores each process may use (folio/placement.py) and starts the
executor with that affinity; here the executor only sizes its thread pool to match, so no
two of its threads share a core (OpenMP barriers spin: an oversubscribed core stalls every
thread of the step).
"""

from __future__ import annotations

import logging

import torch

from shared.cpus import usable_cores

log = logging.getLogger("folio.executor")


def apply_cpu_threads(requested: int | None) -> int:
    """Set torch's intra-op thread count: `requested`, or one per usable core."""
    threads = requested if requested is not None else max(1, len(usable_cores()))
    torch.set_num_threads(threads)
    log.info("CPU threads: %d (%s)", threads,
             "--cpu-threads" if requested is not None else "one per usable core")
    return threads
