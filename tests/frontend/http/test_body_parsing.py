"""A request body costs the event loop almost nothing (frontend/http/body.py): one past its
limit is refused by its declared size before a byte is read, and a large one is parsed on
the prep pool while the loop goes on serving others (a task beside it runs during the parse,
which an inline json.loads would not let happen)."""

from __future__ import annotations

import asyncio
import json

import pytest
from starlette.requests import Request

from folio.frontend.http.body import MAX_BODY_BYTES, read_json
from folio.frontend.openai.errors import ApiError
from folio.frontend.prep import Preparer


def _request(body: bytes, length: int | None = None) -> tuple[Request, list[int]]:
    """A Starlette request with this body; the list counts the body chunks it gave."""
    given: list[int] = []
    chunks = [body[i:i + 65536] for i in range(0, len(body), 65536)] or [b""]

    async def receive():
        index = len(given)
        given.append(index)
        more = index + 1 < len(chunks)
        return {"type": "http.request", "body": chunks[index] if index < len(chunks) else b"",
                "more_body": more}

    headers = [(b"content-type", b"application/json"),
               (b"content-length", str(len(body) if length is None else length).encode())]
    scope = {"type": "http", "method": "POST", "path": "/v1/chat/completions",
             "headers": headers, "query_string": b""}
    return Request(scope, receive), given


def test_a_large_body_is_parsed_off_the_loop_and_a_huge_one_not_read():
    tools = [{"type": "function", "function": {"name": f"f{i}", "parameters": {
        "type": "object", "properties": {f"p{k}": {"type": "string"} for k in range(40)}}}}
        for i in range(1000)]
    raw = json.dumps({"model": "m", "messages": [], "tools": tools}).encode()
    assert 1 << 20 < len(raw) < MAX_BODY_BYTES

    async def main() -> tuple[dict, int]:
        prep = Preparer()
        ticks = 0
        parsing = True

        async def ticker() -> None:
            nonlocal ticks
            while parsing:
                ticks += 1
                await asyncio.sleep(0)

        request, _ = _request(raw)
        await request.body()          # read first: only the parse is watched below
        task = asyncio.create_task(ticker())
        await asyncio.sleep(0)
        before = ticks
        body = await read_json(request, prep)
        during = ticks - before
        parsing = False
        await task
        prep.close()
        return body, during

    body, during = asyncio.run(main())
    assert len(body["tools"]) == 1000
    assert during > 0   # the loop ran another task while the body was parsed

    async def refused() -> list[int]:
        request, given = _request(b"{}", length=MAX_BODY_BYTES + 1)
        with pytest.raises(ApiError, match="exceeds"):
            await read_json(request, Preparer())
        return given

    assert asyncio.run(refused()) == []   # refused by Content-Length, nothing read


def test_lone_surrogates_are_refused_in_any_encoding():
    async def parse(raw: bytes):
        request, _ = _request(raw)
        return await read_json(request, Preparer())

    for raw in (b'{"a": "\\ud800"}', '{"a": "\\ud800"}'.encode("utf-16")):
        with pytest.raises(ApiError, match="lone surrogate"):
            asyncio.run(parse(raw))
    assert asyncio.run(parse('{"a": "é \\u00e9"}'.encode())) == {"a": "é é"}
