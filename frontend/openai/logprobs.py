"""Log-probabilities in the legacy completions shape: tokens, token_logprobs, top_logprobs
and text_offset, the prompt's first (echo) and then the generated tokens'. As Python lists
(streamed events), or as JSON text built in slices (a non-streamed answer's tables: a
prompt's echoed table is encoded once and shared by its n choices)."""

from __future__ import annotations

import asyncio
import json
from dataclasses import dataclass
from typing import Any

_FLOOR = -9999.0   # what OpenAI and vLLM send for -inf (JSON has no infinity)


def _value(logprob: float) -> float:
    return max(logprob, _FLOOR)


def _top(entry: dict[str, Any]) -> dict[str, float]:
    """The k most likely tokens, plus the chosen one when it is not among them (so a
    dict has k or k + 1 entries, as OpenAI's and vLLM's do)."""
    top = {text: _value(lp) for token_id, lp, text in entry["top"]}
    if all(token_id != entry["token_id"] for token_id, _, _ in entry["top"]):
        top.setdefault(entry["decoded_token"], _value(entry["logprob"]))
    return top


def completion_logprobs(entries: list[dict[str, Any]], offset: int = 0,
                        first_token: str | None = None) -> dict[str, Any]:
    """`first_token`: the echoed prompt's first token, which has no log-probability (null
    in token_logprobs and top_logprobs); `entries` are the rest, prompt then output.
    text_offset counts characters of the tokens as listed, from `offset`."""
    tokens: list[str] = []
    token_logprobs: list[float | None] = []
    top: list[dict[str, float] | None] = []
    if first_token is not None:
        tokens.append(first_token)
        token_logprobs.append(None)
        top.append(None)
    for entry in entries:
        tokens.append(entry["decoded_token"])
        token_logprobs.append(_value(entry["logprob"]))
        top.append(_top(entry))
    offsets = []
    position = offset
    for token in tokens:
        offsets.append(position)
        position += len(token)
    return {"tokens": tokens, "token_logprobs": token_logprobs, "top_logprobs": top,
            "text_offset": offsets}


# ---- the same table as JSON text, built in slices (large non-streamed answers) -----------

SLICE_ENTRIES = 1024   # entries encoded between two turns of the event loop


def _json(value: Any) -> str:
    """As the HTTP answers encode JSON (starlette's JSONResponse)."""
    return json.dumps(value, ensure_ascii=False, allow_nan=False, separators=(",", ":"))


@dataclass(frozen=True)
class Columns:
    """A log-prob table as JSON text: each column's items, comma-separated without the
    brackets (b"" when it has none), and the characters its tokens span (where a table that
    follows it starts its text_offset). Encoded once, spliced into any number of choices."""
    tokens: bytes = b""
    token_logprobs: bytes = b""
    top_logprobs: bytes = b""
    text_offset: bytes = b""
    chars: int = 0


NAMES = ("tokens", "token_logprobs", "top_logprobs", "text_offset")


async def encode_columns(entries: list[dict[str, Any]], offset: int = 0,
                         first_token: str | None = None) -> Columns:
    """completion_logprobs(entries, offset, first_token) as Columns, SLICE_ENTRIES entries
    at a time with the event loop's other work (health checks, streams) between slices."""
    parts: dict[str, list[str]] = {name: [] for name in NAMES}
    position = offset
    for start in range(0, max(len(entries), 1), SLICE_ENTRIES):
        if start:
            await asyncio.sleep(0)
        piece = entries[start:start + SLICE_ENTRIES]
        table = completion_logprobs(piece, position, first_token if start == 0 else None)
        if not table["tokens"]:
            continue
        position += sum(map(len, table["tokens"]))
        for name in NAMES:
            parts[name].append(_json(table[name])[1:-1])
    return Columns(*(",".join(parts[name]).encode() for name in NAMES), position - offset)


def spliced(tables: list[Columns]) -> list[bytes]:
    """The JSON object of one choice's `logprobs`, tables one after the other, as pieces
    (each shared table's bytes are not copied into a new string per choice)."""
    out: list[bytes] = []
    for i, name in enumerate(NAMES):
        out.append(b'%s"%s":[' % (b"{" if i == 0 else b",", name.encode()))
        filled = [getattr(table, name) for table in tables if getattr(table, name)]
        for j, fragment in enumerate(filled):
            out.append(b"," + fragment if j else fragment)
        out.append(b"]")
    out.append(b"}")
    return out
