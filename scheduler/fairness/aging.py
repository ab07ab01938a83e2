"""Priority aging, counted in scheduler steps (deterministic, whatever the machine's speed).

A request's priority improves by one for every `aging_steps` steps it waits: at step t, a
request of priority p that arrived at step s is worth p - (t - s) / aging_steps. The current
step is the same for every request, so the order is that of p * aging_steps + s: a static
key, set once at arrival, and the queues never need sorting again. A request of priority 5
is ordered as a priority-0 request arriving 5 * aging_steps steps after it: a stream of
urgent requests holds it back for about that many steps, not for ever.

The scheduler counts in seat-steps (client_clocks.py: a step is max_num_seqs of them), uses
the client's virtual start for s, which is never before the arrival, and orders the queues
and the running list by it (the least urgent, aged, is the one preempted)."""

from __future__ import annotations


def aged(priority: int, step: int, aging_steps: int) -> int:
    """priority * aging_steps + step (aging_steps > 0): lower goes first."""
    return priority * aging_steps + step
