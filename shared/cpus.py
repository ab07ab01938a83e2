"""The CPU cores this process may run on (its affinity mask), for placement and threads."""

from __future__ import annotations

import os


def usable_cores() -> list[int]:
    try:
        return sorted(os.sched_getaffinity(0))
    except (AttributeError, OSError):   # no affinity API on this platform
        return list(range(os.cpu_count() or 1))
