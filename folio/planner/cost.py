"""The planner's cost model: what one step costs, as `folio plan calibrate` measured it on a
real executor, read and written as a small JSON file (docs/planner.md shows one).

A step's executor time is linear in a few features of its plan: a base cost, its prompt
tokens (prefill), its decode rows, the context those rows attend to, and the prompt tokens
times the context they attend to (attention's quadratic part). The scheduler's own time is
a base plus a cost per scheduled request; the hop (plan out to the executor process and its
result back) is a fixed cost per step; a swapped block costs its bytes at the executor's
measured copy rate. Served (`folio plan calibrate` measures it against `folio serve`:
folio/planner/served.py), a step also pays a fixed and a per-row overhead (the control
processes' wake-ups on the executor's cores, the frontend streaming each token) and a request
reaches the scheduler a fixed time after it arrives (read, checked, tokenized).
"""

from __future__ import annotations

import json
import math
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from folio.planner.simulator.inputs import MAX_KV_BLOCKS
from folio.shared.config import PREEMPTION_MODES

FORMAT = "folio-plan-cost/1"
# Executor-time features of a step, in the order of the coefficients.
FEATURES = ("base", "per_prefill_token", "per_decode_row", "per_decode_kcontext",
            "per_prefill_kattention")


def step_features(rows: list[tuple[int, int]]) -> list[float]:
    """rows: (tokens computed, context after them) per scheduled request. A row of one token
    is a decode row; more is a prompt chunk. Context in thousands of tokens; a chunk's
    attention in thousands of (token, context) pairs."""
    prefill = decode = 0
    decode_context = attention = 0.0
    for count, context in rows:
        if count == 1:
            decode += 1
            decode_context += context / 1000
        else:
            prefill += count
            attention += count * (context - count / 2) / 1000
    return [1.0, float(prefill), float(decode), decode_context, attention]


@dataclass(frozen=True)
class KVLayout:
    """What sizes the KV pool at calibration, so other block sizes and KV types can be
    costed at the same memory."""

    num_kv_blocks: int
    block_size: int
    max_model_len: int
    kv_cache_dtype: str               # as stored: the model's dtype, int8, fp8_...
    memory_bytes: int
    bytes_per_token: dict[str, int]   # one token's K and V of every layer, by stored type
    num_swap_blocks: int = 0

    def blocks(self, block_size: int, dtype: str) -> int:
        if dtype not in self.bytes_per_token:
            raise ValueError(f"KV type {dtype} is not in the cost file (it has "
                             f"{', '.join(sorted(self.bytes_per_token))})")
        return self.memory_bytes // (self.bytes_per_token[dtype] * block_size)


@dataclass(frozen=True)
class ServedOverhead:
    """What `folio serve` adds to the in-process costs (folio/planner/served.py)."""

    step_ms: float          # every step
    per_row_ms: float       # every step, per scheduled request
    request_ms: float       # arrival to the scheduler, per request
    rounds: list[dict[str, Any]] = field(default_factory=list)   # the measurements
    trickle: dict[str, Any] = field(default_factory=dict)   # their medians, one at a time


@dataclass(frozen=True)
class CostModel:
    executor_ms: dict[str, float]           # FEATURES -> coefficient
    scheduler_ms: dict[str, float]          # base, per_row
    hop_ms: float
    swap_ms_per_block: float
    kv: KVLayout
    scheduling: dict[str, Any]              # the engine's scheduling flags at calibration
    model: str = ""
    flags: dict[str, Any] = field(default_factory=dict)
    machine: dict[str, Any] = field(default_factory=dict)
    date: str = ""
    fit_error: dict[str, float] = field(default_factory=dict)
    served: ServedOverhead | None = None    # None: calibrated in-process only
    vocab_size: int = 0     # the model's (served calibration draws prompt ids from it)

    def step_ms(self, rows: list[tuple[int, int]], swapped_blocks: int = 0,
                overlapped: bool = False) -> float:
        """overlapped: async scheduling, the scheduler planning and sending the next step
        while the executor runs this one (a step takes the longer of the two)."""
        executor = sum(self.executor_ms[name] * value
                       for name, value in zip(FEATURES, step_features(rows)))
        executor += swapped_blocks * self.swap_ms_per_block
        control = self.scheduler_ms["base"] + self.scheduler_ms["per_row"] * len(rows) \
            + self.hop_ms
        if self.served is not None:   # the wake-ups share the executor's cores
            executor += self.served.step_ms + self.served.per_row_ms * len(rows)
        return max(executor, control) if overlapped else executor + control

    def to_json(self) -> str:
        return json.dumps({"format": FORMAT, **asdict(self)}, indent=2)


def _number(data: dict, path: str) -> float:
    value: Any = data
    for key in path.split("."):
        if not isinstance(value, dict) or key not in value:
            raise ValueError(f"missing {path}")
        value = value[key]
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise ValueError(f"{path} is not a number ({value!r})")
    if value < 0:
        raise ValueError(f"{path} is negative ({value})")
    return value


def _scheduling(data: dict) -> dict[str, Any]:
    """The calibrated scheduling policy, each key a plan reads checked (a hand-edited file
    may lack one)."""
    scheduling = data.get("scheduling")
    if not isinstance(scheduling, dict):
        raise ValueError("missing scheduling")
    for key in ("max_num_seqs", "max_num_batched_tokens"):
        value = scheduling.get(key)
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ValueError(f"scheduling.{key} must be a positive integer, got {value!r}")
    for key in ("enable_prefix_caching", "enable_chunked_prefill"):
        if not isinstance(scheduling.get(key, True), bool):
            raise ValueError(f"scheduling.{key} must be true or false, got "
                             f"{scheduling[key]!r}")
    if "enable_prefix_caching" not in scheduling:
        raise ValueError("missing scheduling.enable_prefix_caching")
    if scheduling.get("preemption_mode") not in PREEMPTION_MODES:
        raise ValueError(f"scheduling.preemption_mode must be one of "
                         f"{', '.join(PREEMPTION_MODES)}, got "
                         f"{scheduling.get('preemption_mode')!r}")
    return scheduling


def _served(data: dict) -> ServedOverhead | None:
    if data.get("served") is None:   # a file calibrated in-process only
        return None
    served = data["served"] if isinstance(data["served"], dict) else {}
    rounds, trickle = served.get("rounds", []), served.get("trickle", {})
    return ServedOverhead(*(_number(data, f"served.{name}")
                            for name in ("step_ms", "per_row_ms", "request_ms")),
                          list(rounds) if isinstance(rounds, list) else [],
                          dict(trickle) if isinstance(trickle, dict) else {})


def load_cost(path: str | Path) -> CostModel:
    """The cost model in `path`; a ValueError naming the first problem."""
    try:
        data = json.loads(Path(path).read_text())
    except OSError as error:
        raise ValueError(f"{path}: cannot read it ({error.strerror})") from None
    except ValueError as error:
        raise ValueError(f"{path}: not JSON ({error})") from None
    try:
        if not isinstance(data, dict) or data.get("format") != FORMAT:
            raise ValueError(f"not a {FORMAT} file (make one with `folio plan calibrate`)")
        executor = {name: _number(data, f"executor_ms.{name}") for name in FEATURES}
        scheduler = {name: _number(data, f"scheduler_ms.{name}") for name in ("base", "per_row")}
        kv = data.get("kv") or {}
        sizes = kv.get("bytes_per_token")
        if not isinstance(sizes, dict) or not sizes:
            raise ValueError("missing kv.bytes_per_token")
        layout = KVLayout(
            int(_number(data, "kv.num_kv_blocks")), int(_number(data, "kv.block_size")),
            int(_number(data, "kv.max_model_len")), str(kv.get("kv_cache_dtype", "auto")),
            int(_number(data, "kv.memory_bytes")),
            {str(k): int(_number(sizes, k)) for k in sizes},
            int(kv.get("num_swap_blocks") or 0))
        if layout.num_kv_blocks < 1 or layout.block_size < 1 or layout.max_model_len < 1:
            raise ValueError("kv.num_kv_blocks, kv.block_size and kv.max_model_len must be "
                             ">= 1")
        if layout.num_kv_blocks > MAX_KV_BLOCKS:
            raise ValueError(f"kv.num_kv_blocks ({layout.num_kv_blocks}) is more than a "
                             f"plan simulates ({MAX_KV_BLOCKS:,})")
        scheduling = _scheduling(data)
        served = _served(data)
        return CostModel(executor, scheduler, _number(data, "hop_ms"),
                         _number(data, "swap_ms_per_block"), layout, scheduling,
                         str(data.get("model", "")), dict(data.get("flags") or {}),
                         dict(data.get("machine") or {}), str(data.get("date", "")),
                         dict(data.get("fit_error") or {}), served,
                         int(data.get("vocab_size") or 0))
    except ValueError as error:
        raise ValueError(f"{path}: {error}") from None
