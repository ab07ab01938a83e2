"""Turns between clients within a priority, as start-time fair queueing takes them, with
scheduler seat-steps as the virtual time (a step is max_num_seqs of them).

Each client (and priority) has a clock. A request starts at its client's clock or at the
current time, whichever is later, and moves that clock on by what it asks for (max_tokens
times n, and its prompt's chunks): its clock runs as fast as the whole server would serve
that client alone. The queue goes by start. A client that sends 4,096 requests at once has
them start one after another into the future, about when the server would reach each if it
served nobody else; a client arriving later starts now, so it waits only for the requests
already due, not for the 4,096. A client alone is served in arrival order; clients that
never queue more than the server serves see plain FCFS.

A client is what the frontend names it (its peer address, or its key); requests with no
name are one anonymous client."""

from __future__ import annotations

MAX_CLOCKS = 65536   # clocks kept before those already behind the current step go


class ClientClocks:
    def __init__(self) -> None:
        self._next: dict[tuple[str | None, int], int] = {}   # (client, priority) -> clock

    def start(self, client: str | None, priority: int, step: int, cost: int) -> int:
        """The virtual start of a new request of `client` at `priority`, arriving at virtual
        time `step` and asking for `cost` (>= 1) seat-steps."""
        key = (client, priority)
        start = max(self._next.get(key, step), step)
        self._next[key] = start + cost
        if len(self._next) > MAX_CLOCKS:
            # A clock behind the current step would start its next request now anyway.
            self._next = {k: t for k, t in self._next.items() if t > step}
        return start

    def __len__(self) -> int:
        return len(self._next)
