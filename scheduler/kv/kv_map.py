"""A snapshot of the KV cache's pages, cheap enough to take every second under load.

Per block: state ("F" free, "U" used, "C" cached-free), reference count, slots holding a
token, and its owner (an index into `requests`; a shared block lists all of its owners in
`shared`). Per request: its block table in reading order, progress and state. Block ids and
request ids only, never token ids. The cost is a few list copies of the pool's length plus
one pass over the block tables of the requests holding blocks.

Built from the KV manager (which holds the tables and the pools) and the scheduler's queues,
passed in: Scheduler.kv_map() calls it.
"""

from __future__ import annotations

import time
from collections.abc import Collection, Sequence
from typing import Any

from folio.scheduler.kv.kv_manager import KVCacheManager
from folio.scheduler.request import Request, RequestStatus
from folio.shared.config import SchedulerConfig

MAX_LISTED_QUEUED = 256      # waiting (and forking) requests listed; the rest only counted
MAX_MAP_BLOCKS = 1 << 22     # a larger pool is sent without its per-block arrays


def _state(request: Request) -> str:
    if request.status is RequestStatus.WAITING and request.num_preemptions:
        return "preempted"
    return request.status.value


def build_kv_map(kv: KVCacheManager, config: SchedulerConfig, *, running: Sequence[Request],
                 swapped: Collection[Request], waiting: Collection[Request],
                 num_requests: int, steps: int,
                 speculative: dict[str, float] | None = None) -> dict[str, Any]:
    """The snapshot of `kv`'s pools and of the requests in the three queues (`waiting` in
    order, each with its forking children); `num_requests` counts every live request and
    `steps` the steps planned so far; `speculative`: the draft planner's summary, when
    speculative decoding is on."""
    size = config.block_size
    pool, swap_pool = kv.pool, kv.swap.pool
    now = time.monotonic()
    waiting_listed = list(waiting)[:MAX_LISTED_QUEUED]
    forking = [child for owner in (*running, *waiting_listed) for child in owner.fork_children]
    listed = [*running, *swapped, *waiting_listed, *forking[:MAX_LISTED_QUEUED]]
    index = {id(request): i for i, request in enumerate(listed)}

    n = pool.num_blocks
    state = bytearray(b"F") * n
    fill = [0] * n
    owner = [-1] * n
    shared: dict[int, list[int]] = {}
    filled = 0
    for i, request in enumerate(running):
        computed = request.num_computed_tokens
        first = kv.num_freed_blocks(request)   # entries freed behind a sliding window: null
        for position, block_id in enumerate(kv.block_ids(request)[first:], first):
            tokens = min(size, max(0, computed - position * size))
            if owner[block_id] < 0:
                owner[block_id] = i
                state[block_id] = 85   # "U"
                filled += tokens
            else:
                shared.setdefault(block_id, [owner[block_id]]).append(i)
                filled += max(0, tokens - fill[block_id])
            fill[block_id] = max(fill[block_id], tokens)
    cached = pool.cached_free_ids()
    for block_id in cached:
        state[block_id] = 67   # "C": only full blocks are ever registered
        fill[block_id] = size

    swap_n = swap_pool.num_blocks
    swap_state = bytearray(b"F") * swap_n
    swap_fill = [0] * swap_n
    swap_owner = [-1] * swap_n
    for request in swapped:
        computed = request.num_computed_tokens
        for position, block_id in enumerate(kv.swap_block_ids(request)):
            swap_state[block_id] = 85
            swap_fill[block_id] = min(size, max(0, computed - position * size))
            swap_owner[block_id] = index[id(request)]

    used = pool.num_used
    counts = {"total": n, "used": used, "cached": len(cached),
              "free": pool.num_usable - used - len(cached), "shared": len(shared),
              "slots_filled": filled,
              "slot_utilization": filled / (used * size) if used else 1.0,
              "swap_total": swap_n, "swap_used": swap_n - swap_pool.num_free,
              "running": len(running), "swapped": len(swapped),
              "waiting": len(waiting) + sum(len(r.fork_children) for r in waiting),
              "requests": num_requests}
    snapshot: dict[str, Any] = {
        "block_size": size, "num_blocks": n, "max_model_len": config.max_model_len,
        "step": steps,   # steps planned so far, as stats()["steps"]
        "requests": [_request(kv, r, now) for r in listed],
        "running": list(range(len(running))),
        "swapped": [index[id(r)] for r in swapped],
        "waiting": [index[id(r)] for r in waiting_listed],
        "shared": [[block_id, owners] for block_id, owners in shared.items()],
        "totals": counts,
        "contiguous": contiguous(config, listed, num_requests),
    }
    if speculative is not None:
        snapshot["speculative"] = speculative
    if n <= MAX_MAP_BLOCKS:
        snapshot["blocks"] = {"state": state.decode(), "ref": pool.ref_counts(),
                              "fill": fill, "owner": owner}
    if swap_n <= MAX_MAP_BLOCKS:
        snapshot["swap"] = {"state": swap_state.decode(), "fill": swap_fill,
                            "owner": swap_owner}
    if kv.states.enabled:
        holder = {r.handle: i for i, r in enumerate(listed)}
        owner = [-1] * kv.states.num_slots
        for slot, handle in kv.states.owners().items():
            owner[slot] = holder.get(handle, -1)
        snapshot["state_slots"] = {"slot_bytes": kv.states.slot_bytes, "owner": owner}
    return snapshot


def _request(kv: KVCacheManager, request: Request, now: float) -> dict[str, Any]:
    age = now - request.arrival_time
    return {"id": request.request_id, "state": _state(request),
            "blocks": kv.block_ids(request), "swap_blocks": kv.swap_block_ids(request),
            # tokens: known ones plus those the step in flight samples (computed counts them)
            "computed": request.num_computed_tokens,
            "tokens": request.num_tokens + request.num_pending,
            "prompt_tokens": len(request.prompt_token_ids),
            "max_tokens": request.sampling.max_tokens,
            "preemptions": request.num_preemptions,
            # speculative decoding: steps that carried drafts, drafts accepted
            "spec_steps": request.spec_steps,
            "spec_accepted": request.spec_accepted_total,
            "wait_s": round(age if request.queue_s is None else request.queue_s, 4),
            "age_s": round(age, 4),
            **({"lora": request.sampling.lora} if request.sampling.lora is not None else {}),
            **({"state_slot": kv.state_slot(request)} if kv.state_slot(request) >= 0 else {}),
            **({"swap_state_slot": kv.swap_state_slot(request)}
               if kv.swap_state_slot(request) >= 0 else {})}


def contiguous(config: SchedulerConfig, listed: list[Request], num_requests: int
               ) -> dict[str, Any]:
    """What reserving max_model_len slots per request, in one piece, would need for the same
    requests (`num_requests` of them, the first of them `listed`): the layout the paged cache
    replaces."""
    size, reserve = config.block_size, config.max_model_len
    per_request = -(-reserve // size)
    fits = config.num_kv_blocks // per_request
    held = [min(r.num_tokens, reserve) for r in listed[:fits]]
    total = num_requests
    return {"reserve_tokens": reserve, "blocks_per_request": per_request,
            "requests": total, "blocks_needed": total * per_request, "fits": fits,
            "slots_filled": sum(held),
            "slot_utilization": sum(held) / (len(held) * reserve) if held else 1.0}
