"""A completion's answer over HTTP: whole (JSON) or streamed (SSE), and its engine work
aborted as soon as nobody will read it (the client left before the answer, or the stream
ended however it did)."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable

from fastapi.responses import JSONResponse, Response, StreamingResponse
from starlette.requests import Request

from folio.frontend.openai.errors import ApiError


async def respond(request: Request, answer: Awaitable) -> Response:
    """`answer`: a route's (job, result), result a dict, a Response (a body built in
    pieces) or an SSE stream. A stream's first chunk is awaited here, before any byte is
    sent: it waits for the engine's first event, which may be a refusal with its own
    status. A client that disconnects before the answer frees its blocks (499)."""
    work = asyncio.create_task(_first(answer))
    watcher = asyncio.create_task(_wait_disconnect(request))
    done, _ = await asyncio.wait({work, watcher}, return_when=asyncio.FIRST_COMPLETED)
    if work not in done:   # the client left before the answer: free its blocks
        work.cancel()
        with contextlib.suppress(asyncio.CancelledError, ApiError):
            await work
        return Response(status_code=499)
    watcher.cancel()
    job, result, first = work.result()
    if first is None:
        return result if isinstance(result, Response) else JSONResponse(result)
    return StreamingResponse(guarded(job, result, first), media_type="text/event-stream",
                             headers={"Cache-Control": "no-cache"})


async def _first(answer: Awaitable):
    job, result = await answer
    if isinstance(result, (dict, Response)):
        return job, result, None
    try:
        return job, result, await result.__anext__()
    except BaseException:
        job.abort()
        raise


async def _wait_disconnect(request: Request) -> None:
    """Returns once the client disconnects: the server's own notice. With the body read,
    uvicorn's receive() sleeps until the connection is lost (or the response is sent), so
    this costs nothing while it waits: no polling, however many requests are queued."""
    while (await request.receive())["type"] != "http.disconnect":
        await asyncio.sleep(0.05)   # not expected once the body is read; never spin


async def guarded(job, stream, first: str):
    """Pass the SSE stream through. However it ends (done, an error event, the client
    gone), abort what is still running of it: a multi-prompt stream that ends with one
    prompt's error leaves no sibling running unread."""
    try:
        yield first
        async for chunk in stream:
            yield chunk
    finally:
        job.abort()
