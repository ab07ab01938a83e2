"""What `folio simulate` replays, and on what: the trace's requests and the simulated machine.

A trace is JSONL, one request a line: {"arrival": s, "prompt_tokens": n, "output_tokens":
n, "prefix" (or "prefix_id"): id (optional), "prefix_tokens": n (optional; default the whole
prompt; at most prompt_tokens), "name": id (optional; unique; default the line's position
among the requests, from 0)}. At most MAX_REQUESTS requests; a bad line is a ValueError
naming the file, the line and the field.
Requests with the same prefix id start with the same prefix_tokens token ids.
"""

from __future__ import annotations

import itertools
import json
import math
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

MAX_REQUESTS = 100_000      # a replay holds every request's token times
MAX_LINE_BYTES = 65_536     # a request is a few short fields; a longer line is no trace line
MAX_TOKENS = 10_000_000     # prompt or output tokens of one request: beyond any context
# The simulated pool's blocks: each is a Python object in the Scheduler (~100 bytes), and
# an 80 GB pool of a 0.5B model in blocks of 16 tokens is ~400,000 of them.
MAX_KV_BLOCKS = 2_000_000


@dataclass(frozen=True)
class TraceRequest:
    arrival: float
    prompt_tokens: int
    output_tokens: int
    prefix: str | None = None
    prefix_tokens: int | None = None
    name: str = ""

    @property
    def length(self) -> int:
        """Prompt plus output, as max_model_len counts it (the last sampled token is never
        written to the cache, so a request holds one slot fewer)."""
        return self.prompt_tokens + self.output_tokens


@dataclass(frozen=True)
class Machine:
    num_kv_blocks: int
    block_size: int = 16
    max_model_len: int = 2048
    max_num_seqs: int = 256
    max_num_batched_tokens: int = 2048
    ms_per_step: float = 10.0
    tokens_per_s: float | None = None   # None: a step's cost does not grow with its tokens
    enable_prefix_caching: bool = True
    preemption_mode: str = "recompute"
    state_slots: int = 0   # a hybrid model's recurrent state slots (0: attention only)


def load_trace(path: str | Path, max_requests: int = MAX_REQUESTS) -> list[TraceRequest]:
    """The requests of the JSONL trace at `path`; a ValueError naming the file, the line and
    the field. Lines are read one at a time and reading stops past `max_requests`, so a
    huge file costs no more memory than the cap."""
    trace: list[TraceRequest] = []
    seen: dict[str, int] = {}   # name -> its line
    for number, text in _lines(path):
        if not text.strip():
            continue
        if len(trace) == max_requests:
            raise ValueError(f"{path}:{number}: more than {max_requests:,} requests (the "
                             "most a trace may hold; stopped reading here)")
        try:
            request = parse_request(text, len(trace))
        except ValueError as error:
            raise ValueError(f"{path}:{number}: {error}") from None
        if request.name in seen:
            raise ValueError(f"{path}:{number}: name {request.name!r} repeats line "
                             f"{seen[request.name]}'s (names must be unique; an unnamed "
                             "request is named by its position, from 0)")
        seen[request.name] = number
        trace.append(request)
    if not trace:
        raise ValueError(f"{path}: no requests")
    return trace


def _lines(path: str | Path) -> Iterator[tuple[int, str]]:
    """(line number, text) of each line, read lazily; a line longer than MAX_LINE_BYTES is
    an error before it is held whole."""
    try:
        with open(path, "rb") as file:
            for number in itertools.count(1):
                raw = file.readline(MAX_LINE_BYTES + 1)
                if not raw:
                    return
                if len(raw) > MAX_LINE_BYTES:
                    raise ValueError(f"{path}:{number}: longer than {MAX_LINE_BYTES:,} bytes "
                                     "(not a trace line)")
                try:
                    yield number, raw.decode()
                except UnicodeDecodeError:
                    raise ValueError(f"{path}:{number}: not UTF-8 text") from None
    except OSError as error:
        raise ValueError(f"{path}: cannot read it ({error.strerror})") from None


def parse_request(text: str, index: int) -> TraceRequest:
    """One trace line; `index` (its position) names a request that gives no name."""
    try:
        item = json.loads(text)
    except ValueError as error:
        raise ValueError(f"not JSON ({error})") from None
    if not isinstance(item, dict):
        raise ValueError(f"not a JSON object ({type(item).__name__})")
    prompt = _count(item, "prompt_tokens")
    return TraceRequest(
        arrival=_arrival(item), prompt_tokens=prompt,
        output_tokens=_count(item, "output_tokens"), prefix=_prefix(item),
        prefix_tokens=_prefix_tokens(item, prompt), name=_name(item, index))


def _arrival(item: dict) -> float:
    if "arrival" not in item:
        raise ValueError("missing arrival")
    value = item["arrival"]
    # json reads Infinity and NaN: a time no clock reaches
    if isinstance(value, bool) or not isinstance(value, (int, float)) \
            or not math.isfinite(value) or value < 0:
        raise ValueError(f"arrival must be a finite number of seconds >= 0, got {value!r}")
    return float(value)


def _count(item: dict, key: str) -> int:
    if key not in item:
        raise ValueError(f"missing {key}")
    return _token_count(item[key], key)


def _token_count(value: Any, key: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= MAX_TOKENS:
        raise ValueError(f"{key} must be an integer in 1..{MAX_TOKENS:,}, got {value!r}")
    return value


def _prefix(item: dict) -> str | None:
    key = "prefix" if "prefix" in item else "prefix_id"
    value = item.get(key)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (str, int)):
        raise ValueError(f"{key} must be a string or an integer, got {_short(value)}")
    return str(value)


def _prefix_tokens(item: dict, prompt_tokens: int) -> int | None:
    value = item.get("prefix_tokens")
    if value is None:
        return None
    count = _token_count(value, "prefix_tokens")
    if count > prompt_tokens:
        raise ValueError(f"prefix_tokens ({count}) is more than prompt_tokens "
                         f"({prompt_tokens})")
    return count


def _name(item: dict, index: int) -> str:
    value = item.get("name")
    if value is None or value == "":
        return str(index)
    if isinstance(value, bool) or not isinstance(value, (str, int)):
        raise ValueError(f"name must be a string or an integer, got {_short(value)}")
    return str(value)


def _short(value: Any) -> str:
    """A value for a one-line error: nested JSON can be any size."""
    text = json.dumps(value)
    return text if len(text) <= 40 else f"{text[:37]}..."
