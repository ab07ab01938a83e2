"""The page map (`kv_map`): the scheduler's reply to `kv_map_request`, and the frontend's to
a client's `kv_map`. Block ids and request ids only. Its shape is declared here field by
field (docs/protocol.md §5 "The page map"); decoding checks every field against it, then
what one field says of another (indices name a listed request, one entry per block)."""

from __future__ import annotations

from typing import Any

from folio.shared.protocol.links import Link
from folio.shared.sampling_params import MAX_LORA_NAME_CHARS
from folio.shared.protocol.schema import (Field, Float, Int, Ints, Items, ListOf, Message, Number, Shape,
                                 Str)
from folio.shared.protocol.wire import MAX_BLOCK_ID, Body, ProtocolError

MAX_KV_MAP_BLOCKS = 1 << 22    # per-block arrays longer than this are not sent
MAX_KV_MAP_REQUESTS = 1 << 16
KV_MAP_STATES = frozenset({"waiting", "running", "swapped", "preempted", "forking"})

_INDICES = Ints(0, MAX_KV_MAP_REQUESTS - 1, MAX_KV_MAP_REQUESTS)   # into `requests`
_PER_BLOCK = Ints(0, MAX_BLOCK_ID, MAX_KV_MAP_BLOCKS)
_OWNERS = Ints(-1, MAX_KV_MAP_REQUESTS - 1, MAX_KV_MAP_BLOCKS)   # -1: none

REQUEST = Shape("kv_map.requests", (
    Field("id", Str()),
    Field("state", Str(16), rule="one of " + ", ".join(f"`{s}`" for s in sorted(KV_MAP_STATES))),
    Field("blocks", Ints(0, MAX_BLOCK_ID)),
    Field("swap_blocks", Ints(0, MAX_BLOCK_ID)),
    *(Field(name, Int(0)) for name in ("computed", "tokens", "prompt_tokens")),
    Field("max_tokens", Int(0), default=None, send_nil=True),
    Field("preemptions", Int(0)),
    # speculative decoding: steps that carried drafts, drafts accepted (0 when off)
    Field("spec_steps", Int(0), default=0),
    Field("spec_accepted", Int(0), default=0),
    Field("wait_s", Float()),
    Field("age_s", Float()),
    Field("lora", Str(MAX_LORA_NAME_CHARS), default=None),   # absent: the base model
    Field("state_slot", Int(0, MAX_BLOCK_ID), default=None),   # a hybrid's, while it holds one
    Field("swap_state_slot", Int(0, MAX_BLOCK_ID), default=None),   # its host one, swapped out
))
BLOCKS = Shape("kv_map.blocks", (
    Field("state", Str(MAX_KV_MAP_BLOCKS), rule="one of `F`, `U`, `C` per block"),
    Field("ref", _PER_BLOCK), Field("fill", _PER_BLOCK), Field("owner", _OWNERS)), table=False)
SWAP = Shape("kv_map.swap", (
    Field("state", Str(MAX_KV_MAP_BLOCKS), rule="one of `F`, `U` per block"),
    Field("fill", _PER_BLOCK), Field("owner", _OWNERS)), table=False)
PAGE_MAP = Shape("kv_map.map", (
    Field("block_size", Int(1, 1 << 16)),
    Field("num_blocks", Int(0, MAX_BLOCK_ID)),
    Field("max_model_len", Int(1, 1 << 30)),
    Field("step", Int(0)),
    Field("requests", ListOf(REQUEST, MAX_KV_MAP_REQUESTS)),
    Field("running", _INDICES), Field("swapped", _INDICES), Field("waiting", _INDICES),
    Field("shared", ListOf(Items("kv_map.shared", (
        Field("block id", Int(0, MAX_BLOCK_ID)), Field("owners", _INDICES))),
        MAX_KV_MAP_BLOCKS)),
    Field("totals", Shape("kv_map.totals", tuple(Field(key, Number(0)) for key in (
        "total", "used", "cached", "free", "shared", "slots_filled", "slot_utilization",
        "swap_total", "swap_used", "running", "swapped", "waiting", "requests")), table=False)),
    Field("contiguous", Shape("kv_map.contiguous", tuple(Field(key, Number(0)) for key in (
        "reserve_tokens", "blocks_per_request", "requests", "blocks_needed", "fits",
        "slots_filled", "slot_utilization")), table=False)),
    # present when speculative decoding is on (docs/spec_decode.md)
    Field("speculative", Shape("kv_map.speculative", tuple(Field(key, Number(0)) for key in (
        "drafts", "draft_tokens", "accepted_tokens", "mean_accepted_length")), table=False),
        default=None),
    Field("blocks", BLOCKS, default=None),   # absent for a pool too large for these arrays
    Field("swap", SWAP, default=None),
    # A hybrid model's recurrent state slots (scheduler/kv/state_slots.py): the bytes of one,
    # and per slot the index in `requests` of the request holding it, -1 when free.
    Field("state_slots", Shape("kv_map.state_slots", (
        Field("slot_bytes", Int(0)), Field("owner", _OWNERS)), table=False), default=None),
    Field("replica", Int(0, 1 << 16), default=None),   # set by a data-parallel frontend
))


def encode_kv_map(snapshot: dict[str, Any] | None, request_id: str | None = None) -> bytes:
    """The scheduler's page map (scheduler/kv/kv_map.py), or {} without an executor; with
    request_id, the frontend's reply to a client's kv_map."""
    return KV_MAP.pack(map=snapshot or {}, request_id=request_id)


def decode_kv_map(body: Body) -> dict[str, Any] | None:
    """The page map, checked field by field (None: no executor attached)."""
    raw = body.body.get("map")
    if raw == {}:
        return None
    snapshot = KV_MAP.read_fields(body)["map"]
    _check_references(snapshot)
    return snapshot


KV_MAP = Message("kv_map", (Link.SCHEDULER_TO_FRONTEND, Link.GATEWAY_TO_CLIENT), (
    Field("map", PAGE_MAP, rule="`kv_map.map` (below), or `{}` without an executor"),
    Field("id", Str(), "request_id", default=None),   # the frontend's reply to a client
), codec=(encode_kv_map, decode_kv_map))
DECLARED = (KV_MAP,)


def _check_references(snapshot: dict[str, Any]) -> None:
    """What the declared shape cannot say: states, indices that name a listed request, one
    entry per block, shared blocks inside the pool."""
    last = len(snapshot["requests"]) - 1
    for request in snapshot["requests"]:
        if request["state"] not in KV_MAP_STATES:
            raise ProtocolError(f"kv_map.requests: field 'state' must be one of "
                                f"{sorted(KV_MAP_STATES)}")
    for name in ("running", "swapped", "waiting"):
        if any(i > last for i in snapshot[name]):
            raise ProtocolError(f"kv_map.map: field {name!r} must index into 'requests'")
    num_blocks = snapshot["num_blocks"]
    for block_id, owners in snapshot["shared"]:
        if block_id >= num_blocks or any(i > last for i in owners):
            raise ProtocolError("kv_map: 'shared' entries are [block id, [owners]]")
    for name, states in (("blocks", "FUC"), ("swap", "FU")):
        pages = snapshot.get(name)
        if pages is None:
            continue
        length = len(pages["state"])
        if (name == "blocks" and length != num_blocks) or not set(pages["state"]) <= set(states):
            raise ProtocolError(f"kv_map.{name}: field 'state' must be one character of "
                                f"{states!r} per block")
        for array in ("ref", "fill", "owner") if name == "blocks" else ("fill", "owner"):
            values = pages[array]
            if len(values) != length or (array == "owner" and values and max(values) > last):
                raise ProtocolError(f"kv_map.{name}: field {array!r} must have one entry per "
                                    "block, owners indexing into 'requests'")
