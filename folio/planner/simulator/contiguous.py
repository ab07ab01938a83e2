"""The contiguous-reservation baseline for `folio simulate`.

A system that reserves R slots in one piece per request is the paged scheduler with one
block of R slots per request: it admits a request when one whole reservation is free, never
grows it (R covers the request's whole life), never shares it and never preempts. So the
baseline runs the same real Scheduler on the same slots cut into blocks of R, with prefix
caching off, and its numbers come out of the same code and the same arithmetic.
"""

from __future__ import annotations

from dataclasses import replace

from folio.planner.simulator.inputs import Machine, TraceRequest


def reserved(machine: Machine, reserve_tokens: int) -> Machine | None:
    """The machine whose every block is one reservation of `reserve_tokens` slots, or None
    if not even one reservation fits the pool."""
    slots = machine.num_kv_blocks * machine.block_size
    count = slots // reserve_tokens
    if count == 0:
        return None
    return replace(machine, num_kv_blocks=count, block_size=reserve_tokens,
                   max_model_len=reserve_tokens, enable_prefix_caching=False)


def baselines(machine: Machine, trace: list[TraceRequest]) -> list[tuple[str, Machine | None]]:
    """(name, machine) for reserving max_model_len, and for the trace's true maximum (the
    best any static reservation could do, knowing every request's length in advance)."""
    true_max = max(r.length for r in trace)
    limit = machine.max_model_len
    return [(f"contiguous, reserve max_model_len={limit}", reserved(machine, limit)),
            (f"contiguous, reserve true max={true_max}", reserved(machine, true_max))]
