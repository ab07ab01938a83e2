"""`folio plan --workload SPEC`: the requests a plan replays.

    poisson:rate=4,n=200,prompt=256,output=128      Poisson arrivals, 4 requests/s
    fixed:rate=2,n=50,prompt=64-512,output=16-256   one every 0.5 s; lengths uniform in ranges
    poisson:rate=4,n=200,prompt=512,output=64,prefix=384,prefixes=4
                                                    the first 384 prompt tokens are one of 4
                                                    shared prefixes (a system prompt, say)
    trace.jsonl                                     a `folio simulate` trace (one request a
                                                    line: arrival, prompt_tokens, output_tokens,
                                                    optional prefix or prefix_id, prefix_tokens)

Keys: rate (requests/s, > 0), n (requests, at most 100,000), prompt, output (tokens: N or LO-HI), prefix
(shared tokens), prefixes (how many distinct prefixes, default 1), seed (default 0). A
rate search (--slo) scales a trace's arrival times. A trace holds at most 100,000 requests
too (reading stops past them), each line checked field by field.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, replace
from pathlib import Path

from folio.planner.simulator.inputs import MAX_REQUESTS, TraceRequest, load_trace

KINDS = ("poisson", "fixed")
KEYS = ("rate", "n", "prompt", "output", "prefix", "prefixes", "seed")


def _span(text: str, key: str) -> tuple[int, int]:
    low, _, high = text.partition("-")
    try:
        span = (int(low), int(high or low))
    except ValueError:
        raise ValueError(f"{key}={text}: a token count N or a range LO-HI") from None
    if span[0] < 1 or span[1] < span[0]:
        raise ValueError(f"{key}={text}: counts >= 1, LO <= HI")
    return span


@dataclass(frozen=True)
class Workload:
    spec: str
    kind: str                    # poisson, fixed or trace
    rate: float                  # requests/s (a trace's: its requests over its span)
    n: int
    prompt: tuple[int, int] = (1, 1)
    output: tuple[int, int] = (1, 1)
    prefix: int = 0
    prefixes: int = 1
    seed: int = 0
    requests: tuple[TraceRequest, ...] = ()   # a trace's, as read

    def at_rate(self, rate: float) -> "Workload":
        return replace(self, rate=rate)

    def trace(self) -> list[TraceRequest]:
        if self.kind == "trace":
            span = max(r.arrival for r in self.requests)
            scale = (self.n / self.rate) / span if span else 1.0
            return [replace(r, arrival=r.arrival * scale) for r in self.requests]
        rng = random.Random(self.seed)
        clock, requests = 0.0, []
        for index in range(self.n):
            prompt = rng.randint(*self.prompt)
            shared = f"p{index % self.prefixes}" if self.prefix else None
            requests.append(TraceRequest(clock, prompt, rng.randint(*self.output), shared,
                                         self.prefix or None))
            clock += rng.expovariate(self.rate) if self.kind == "poisson" else 1 / self.rate
        return requests


def parse_workload(spec: str) -> Workload:
    """The workload `spec` names; a ValueError naming the problem."""
    kind, colon, rest = spec.partition(":")
    if not colon or kind not in KINDS:
        if Path(spec).is_file():
            requests = load_trace(spec)
            span = max(r.arrival for r in requests)
            return Workload(spec, "trace", len(requests) / span if span else float("inf"),
                            len(requests), requests=tuple(requests))
        raise ValueError(f"{spec!r}: not poisson:..., fixed:... or a trace file")
    values: dict[str, str] = {}
    for item in filter(None, rest.split(",")):
        key, equals, value = item.partition("=")
        if not equals or key not in KEYS:
            raise ValueError(f"{spec!r}: unknown key {key!r} (keys: "
                             f"{', '.join(KEYS)})")
        values[key] = value
    missing = [k for k in ("rate", "n", "prompt", "output") if k not in values]
    if missing:
        raise ValueError(f"{spec!r}: give {', '.join(missing)}")
    try:
        rate, n = float(values["rate"]), int(values["n"])
        prefix, prefixes = int(values.get("prefix", 0)), int(values.get("prefixes", 1))
        seed = int(values.get("seed", 0))
    except ValueError as error:
        raise ValueError(f"{spec!r}: {error}") from None
    if not rate > 0 or rate == float("inf") or not 1 <= n <= MAX_REQUESTS or prefix < 0 \
            or prefixes < 1:
        raise ValueError(f"{spec!r}: rate > 0, 1 <= n <= {MAX_REQUESTS}, prefix >= 0, "
                         "prefixes >= 1")
    try:
        prompt, output = _span(values["prompt"], "prompt"), _span(values["output"], "output")
    except ValueError as error:
        raise ValueError(f"{spec!r}: {error}") from None
    if prefix > prompt[0]:
        raise ValueError(f"{spec!r}: prefix={prefix} is longer than the shortest "
                         f"prompt ({prompt[0]})")
    return Workload(spec, kind, rate, n, prompt, output, prefix, prefixes, seed)
