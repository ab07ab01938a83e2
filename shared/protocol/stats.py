"""The scheduler's counters (`stats.stats`, and a frontend's `health.stats`), declared: each
known key with its type and range. Decoding checks every one that is present and keeps
only those (a key this build does not know is dropped, as unknown body keys are), so a
peer cannot pass a huge or wrongly typed map on to /metrics or an SDK caller."""

from __future__ import annotations

from folio.shared.protocol.schema import Bool, Field, Float, Int, Ints, ListOf, MapOf, Shape

# Every count is of samples; with no executor attached only the last three are present.
_COUNTS = ("kv_blocks_total", "kv_blocks_free", "kv_blocks_used", "kv_blocks_cached")
_FIELDS = (
    *(Field(key, Int(0), default=None) for key in _COUNTS),
    Field("kv_slot_utilization", Float(0, 1), default=None),
    *(Field(key, Int(0), default=None) for key in (
        "swap_blocks_total", "swap_blocks_free", "num_running", "num_waiting", "num_swapped",
        "steps", "preemptions_recompute", "preemptions_swap", "prefix_cache_queries",
        "prefix_cache_hits", "num_finished", "forks")),
    # A hybrid model's recurrent state slots (scheduler/kv/state_slots.py), present for one.
    Field("state_slots_total", Int(0), default=None),
    Field("state_slots_used", Int(0), default=None),
    Field("state_checkpoints", Int(0), default=None),
    Field("swap_state_slots_total", Int(0), default=None),
    Field("swap_state_slots_free", Int(0), default=None),
    # Speculative decoding (scheduler/spec_decode.py), present when it is on.
    *(Field(key, Int(0), default=None) for key in (
        "spec_decode_num_drafts", "spec_decode_num_draft_tokens",
        "spec_decode_num_accepted_tokens")),
    Field("spec_decode_num_accepted_tokens_per_pos", Ints(0, max_len=64), default=None),
    # Multi-step decoding (scheduler/multi_step.py), present when it is on.
    Field("multi_step_bursts", Int(0), default=None),
    Field("multi_step_extra_tokens", Int(0), default=None),
    # Decode-only steps and the weights they read (scheduler/decode_rate.py).
    Field("decode_steps", Int(0), default=None),
    Field("decode_forward_seconds", Float(0), default=None),
    Field("weight_bytes_per_step", Int(0), default=None),
    Field("decode_weight_read_gbps", Float(0), default=None),
    Field("executor_alive", Bool(), default=None),
    Field("executor_ranks", Ints(0, 1 << 31, 1024), default=None),
    Field("num_frontends", Int(0), default=None),
    # LoRA (docs/lora.md), present while adapters are loaded: unfinished requests per
    # adapter, running (swapped ones included) and waiting.
    Field("lora_running", MapOf(Int(0), 4096), default=None),
    Field("lora_waiting", MapOf(Int(0), 4096), default=None),
)

STATS = Shape("stats.stats", _FIELDS)

# A frontend with data-parallel replicas sums their counts and lists each one's own.
MAX_REPLICAS = 1024
REPLICA_STATS = Shape("health.stats.replicas", (Field("replica", Int(0, MAX_REPLICAS)),
                                                *_FIELDS), table=False)
HEALTH_STATS = Shape("health.stats", (
    *_FIELDS, Field("replicas", ListOf(REPLICA_STATS, MAX_REPLICAS), default=None)),
    table=False)
