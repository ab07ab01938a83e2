"""Resident memory of a process, for the soaks' checks that nothing grows."""

from __future__ import annotations


def rss_mib(pid: int) -> float | None:
    """VmRSS of the process, in MiB; None once it is gone."""
    try:
        with open(f"/proc/{pid}/status") as status:
            for line in status:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1]) / 1024
    except OSError:
        return None
    return None
