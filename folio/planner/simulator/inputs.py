"""What `folio simulate` replays, and on what: the trace's requests and the simulated machine.

A trace is JSONL, one request a line: {"arrival": s, "prompt_tokens": n, "output_tokens":
n, "prefix" (or "prefix_id"): id (optional), "prefix_tokens": n (optional; default the whole
prompt)}.
Requests with the same prefix id start with the same prefix_tokens token ids.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path


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


def load_trace(path: str | Path) -> list[TraceRequest]:
    trace = []
    for number, line in enumerate(Path(path).read_text().splitlines(), 1):
        if not line.strip():
            continue
        try:
            item = json.loads(line)
            prefix = item.get("prefix", item.get("prefix_id"))
            request = TraceRequest(
                arrival=float(item["arrival"]), prompt_tokens=int(item["prompt_tokens"]),
                output_tokens=int(item["output_tokens"]),
                prefix=None if prefix is None else str(prefix),
                prefix_tokens=item.get("prefix_tokens"), name=str(item.get("name", "")))
        except (ValueError, KeyError, TypeError, AttributeError) as error:
            raise ValueError(f"{path}:{number}: not a trace line ({error})") from None
        if request.arrival < 0 or request.prompt_tokens < 1 or request.output_tokens < 1:
            raise ValueError(f"{path}:{number}: arrival >= 0, prompt_tokens and "
                             "output_tokens >= 1")
        trace.append(request)
    if not trace:
        raise ValueError(f"{path}: no requests")
    return trace
