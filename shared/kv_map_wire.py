"""The page map (`kv_map`): the scheduler's reply to `kv_map_request`, and the frontend's to
a client's `kv_map`. Block ids and request ids only, checked field by field on decode."""

from __future__ import annotations

from typing import Any

from folio.shared.wire import MAX_BLOCK_ID, Body, ProtocolError, pack

MAX_KV_MAP_BLOCKS = 1 << 22    # per-block arrays longer than this are not sent
MAX_KV_MAP_REQUESTS = 1 << 16
KV_MAP_STATES = frozenset({"waiting", "running", "swapped", "preempted", "forking"})


def encode_kv_map(snapshot: dict[str, Any] | None, request_id: str | None = None) -> bytes:
    """The scheduler's page map (scheduler/kv_map.py), or {} without an executor; with
    request_id, the frontend's reply to a client's kv_map."""
    body: dict[str, Any] = {"map": snapshot or {}}
    if request_id is not None:
        body["id"] = request_id
    return pack("kv_map", body)


def decode_kv_map(body: Body) -> dict[str, Any] | None:
    """The page map, checked field by field (None: no executor attached)."""
    raw = body.map("map")
    if not raw:
        return None
    top = Body("kv_map.map", raw)
    num_blocks = top.int("num_blocks", 0, MAX_BLOCK_ID)
    top.int("block_size", 1, 1 << 16)
    top.int("max_model_len", 1, 1 << 30)
    top.int("step", 0)
    requests = top.list("requests", MAX_KV_MAP_REQUESTS)
    last = len(requests) - 1
    for item in requests:
        if not isinstance(item, dict):
            raise ProtocolError("kv_map: each request must be a map")
        one = Body("kv_map.requests", item)
        one.str("id")
        if one.str("state", 16) not in KV_MAP_STATES:
            raise one.fail("state", f"one of {sorted(KV_MAP_STATES)}")
        for name in ("blocks", "swap_blocks"):
            one.ints(name, 0, MAX_BLOCK_ID)
        for name in ("computed", "tokens", "prompt_tokens", "preemptions"):
            one.int(name, 0)
        one.int("max_tokens", 0, optional=True)
        one.float("wait_s")
        one.float("age_s")
    for name in ("running", "swapped", "waiting"):
        top.ints(name, 0, last, MAX_KV_MAP_REQUESTS)
    for entry in top.list("shared", MAX_KV_MAP_BLOCKS):
        if not (isinstance(entry, list) and len(entry) == 2):
            raise ProtocolError("kv_map: 'shared' entries are [block id, [owners]]")
        Body("kv_map.shared", {"b": entry[0], "o": entry[1]}).int("b", 0, num_blocks - 1)
        Body("kv_map.shared", {"o": entry[1]}).ints("o", 0, last, MAX_KV_MAP_REQUESTS)
    for name in ("totals", "contiguous"):
        section = top.map(name)
        for key in section:
            Body(f"kv_map.{name}", section).float(key)
    for name, states in (("blocks", "FUC"), ("swap", "FU")):
        if name not in raw:
            continue   # a pool too large for per-block arrays
        pages = Body(f"kv_map.{name}", top.map(name))
        state = pages.str("state", MAX_KV_MAP_BLOCKS)
        length = len(state)
        if (name == "blocks" and length != num_blocks) or not set(state) <= set(states):
            raise pages.fail("state", f"one character of {states!r} per block")
        arrays = ("ref", "fill", "owner") if name == "blocks" else ("fill", "owner")
        for array in arrays:
            low = -1 if array == "owner" else 0
            high = last if array == "owner" else MAX_BLOCK_ID
            if len(pages.ints(array, low, high, MAX_KV_MAP_BLOCKS)) != length:
                raise pages.fail(array, "one entry per block")
    return raw
