"""A request's JSON body, read within bounds: JSON media types only, at most MAX_BODY_BYTES
(refused without reading more), a JSON object of valid Unicode. The refusals are the
HTTP API's errors (frontend/openai/errors.py).

Refusing a body costs the event loop almost nothing: its size is checked before any of it
is parsed (by Content-Length, or as a chunked body's bytes arrive), and a body past
PrepConfig.inline_chars is parsed (and checked for lone surrogates) on the frontend's
bounded prep pool (frontend/prep.py), not on the loop, so a client sending big bodies
that the routes then refuse (a tool list past its limit, say) does not stall the streams
and /health of everyone else."""

from __future__ import annotations

import json
from typing import Any

from starlette.requests import Request

from folio.frontend.openai.errors import ApiError, invalid
from folio.frontend.prep import Preparer

MAX_BODY_BYTES = 4 * 2**20


async def read_json(request: Request, prep: Preparer | None = None) -> dict[str, Any]:
    """The body as a JSON object, or a 400 (415 for a body that is not JSON by its type).
    With `prep`, a large body is parsed on its pool."""
    raw = await _read_body(request)
    if prep is None:
        return parse_json(raw)
    return await prep.run(len(raw), parse_json, raw)


def parse_json(raw: bytes) -> dict[str, Any]:
    """A body's bytes as a JSON object of valid Unicode, or the 400 that says why not."""
    try:
        body = json.loads(raw)
    except (ValueError, RecursionError) as error:
        raise invalid(f"request body is not valid JSON: {error}") from None
    if not isinstance(body, dict):
        raise invalid("request body must be a JSON object")
    # JSON may carry lone surrogates ("\\ud800"); nothing downstream can encode them. Only
    # an escape can make one in UTF-8 bytes: look when there is one, or when the body is in
    # UTF-16 or UTF-32 (json.loads reads those too; their ASCII has NUL bytes).
    if b"\\u" in raw or b"\x00" in raw:
        try:
            json.dumps(body, ensure_ascii=False).encode("utf-8")
        except UnicodeEncodeError:
            raise invalid("request body contains text that is not valid Unicode "
                          "(a lone surrogate)") from None
    return body


def _check_content_type(request: Request) -> None:
    """A browser's cross-origin "simple" POST (text/plain, forms) is no JSON client: refuse
    it (no preflight protects a local server from it). No Content-Type at all is allowed."""
    given = request.headers.get("content-type")
    if given is None:
        return
    kind = given.split(";", 1)[0].strip().lower()
    if kind != "application/json" and not kind.endswith("+json"):
        raise ApiError(415, f"Content-Type {given[:100]!r} is not JSON; send "
                       "'Content-Type: application/json'", code="unsupported_media_type",
                       error_type="invalid_request_error")


async def _read_body(request: Request) -> bytes:
    """The body, refused (400) past MAX_BODY_BYTES without reading more than that: by its
    Content-Length at once, or as a chunked body grows."""
    _check_content_type(request)
    declared = request.headers.get("content-length")
    if declared is not None:
        if not declared.strip().isdigit():
            raise invalid(f"Content-Length {declared[:40]!r} is not a number")
        if int(declared) > MAX_BODY_BYTES:
            raise invalid(f"request body of {int(declared)} bytes exceeds {MAX_BODY_BYTES}")
    chunks, size = [], 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > MAX_BODY_BYTES:
            raise invalid(f"request body exceeds {MAX_BODY_BYTES} bytes")
        chunks.append(chunk)
    return b"".join(chunks)
