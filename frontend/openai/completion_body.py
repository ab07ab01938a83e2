"""A non-streamed /v1/completions answer with log-probabilities, built as JSON text in pieces.

Its size is prompts × n × (echoed prompt tokens + generated tokens) × (logprobs + 1)
entries, and each prompt's echoed table is the same in its n choices. So that table is
encoded once per prompt and its bytes are spliced into every choice; every table is encoded
a slice at a time with the event loop's other work in between; and a large answer is sent
as it is built (the transport's flow control holds at most a window of it), so the frontend
holds one prompt's table, not the whole answer. `logprob_entries` is the size estimate the
request is refused by, before any work, past MAX_RESPONSE_LOGPROBS.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

from fastapi.responses import Response, StreamingResponse

from folio.frontend.openai.logprobs import Columns, encode_columns, spliced

# Log-prob entries (a token or one of its top alternatives) one non-streamed answer may
# carry: about 55 MB of JSON, and what the frontend may hold of them while it waits.
MAX_RESPONSE_LOGPROBS = 2 * 2**20
BYTES_PER_ENTRY = 26   # measured: JSON of a token with 20 alternatives, per entry
STREAM_ABOVE_ENTRIES = 65_536   # smaller answers go out whole, with a Content-Length


def logprob_entries(prompt_lengths: list[int], n: int, echo: bool, max_tokens: int,
                    logprobs: int) -> int:
    """The entries an answer would carry at most."""
    tokens = sum(n * ((length if echo else 0) + max_tokens) for length in prompt_lengths)
    return tokens * (logprobs + 1)


def too_large_message(prompt_lengths: list[int], n: int, echo: bool, max_tokens: int,
                      logprobs: int, field: str) -> str:
    entries = logprob_entries(prompt_lengths, n, echo, max_tokens, logprobs)
    prompt = f"{sum(prompt_lengths)} prompt tokens + " if echo else ""
    return (f"this request's log-probabilities would make an answer of up to {entries} "
            f"entries (about {entries * BYTES_PER_ENTRY // 10**6} MB): n = {n} × "
            f"({prompt}{len(prompt_lengths)} prompt(s) × {max_tokens} max tokens) × "
            f"({field} {logprobs} + 1); at most {MAX_RESPONSE_LOGPROBS} are allowed. Ask for "
            f"fewer prompts per request, a smaller n, max_tokens or {field}")


@dataclass(frozen=True)
class Choice:
    index: int
    text: str
    logprobs: list[dict[str, Any]] | None   # the generated tokens' entries
    finish_reason: str | None
    stop_reason: str | None


@dataclass(frozen=True)
class PromptAnswer:
    """One prompt's choices; `echoed`: its table (first token, then entries), when echoed."""
    choices: list[Choice]
    echoed: tuple[str, list[dict[str, Any]]] | None


def _json(value: Any) -> bytes:
    return json.dumps(value, ensure_ascii=False, allow_nan=False,
                      separators=(",", ":")).encode()


async def _pieces(head: dict[str, Any], answers: list[PromptAnswer],
                  usage: dict[str, int]) -> AsyncIterator[bytes]:
    yield _json(head)[:-1] + b',"choices":['
    first = True
    for answer in answers:
        shared = Columns()
        if answer.echoed is not None:
            first_token, entries = answer.echoed
            shared = await encode_columns(entries, 0, first_token)
        for choice in answer.choices:
            out = [b"" if first else b",", b'{"index":%d,"text":' % choice.index,
                   _json(choice.text), b',"logprobs":']
            first = False
            if choice.logprobs is None:
                out.append(b"null")
            else:
                own = await encode_columns(choice.logprobs, shared.chars)
                out += spliced([shared, own])
            out.append(b',"finish_reason":%s,"stop_reason":%s}' % (
                _json(choice.finish_reason), _json(choice.stop_reason)))
            yield b"".join(out)
            await asyncio.sleep(0)
    yield b'],"usage":' + _json(usage) + b"}"


async def completion_response(head: dict[str, Any], answers: list[PromptAnswer],
                              usage: dict[str, int], entries: int) -> Response:
    """The answer: whole when small, else streamed as it is built (chunked)."""
    pieces = _pieces(head, answers, usage)
    if entries <= STREAM_ABOVE_ENTRIES:
        return Response(b"".join([piece async for piece in pieces]),
                        media_type="application/json")
    return StreamingResponse(pieces, media_type="application/json")
