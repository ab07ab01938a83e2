"""The OpenAI-compatible HTTP API (FastAPI on uvicorn, in the frontend's own event loop).

Routes: GET /v1/models, GET /v1/models/{id}, POST /v1/completions, POST /v1/chat/completions,
POST /tokenize, POST /detokenize, GET /health, GET /metrics, GET /v1/kv/map (the KV cache's
page map), the chat page at / and the page map's live view at /kv. Errors use OpenAI's envelope
{"error": {"message", "type", "param", "code"}}.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import hmac
import json
import logging
import time
from importlib import resources
from typing import Any

import uvicorn
from uvicorn.config import HTTP_PROTOCOLS
from uvicorn.importer import import_from_string
from fastapi import FastAPI, Request
from fastapi.responses import HTMLResponse, JSONResponse, Response, StreamingResponse
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.requests import ClientDisconnect

from folio.frontend.engine_client import EngineClient
from folio.frontend.http_limits import (IDLE_TIMEOUT_S, MAX_HEAD_BYTES, REQUEST_TIMEOUT_S,
                                  ConnectionGate, allowed_hosts, connection_cap, gated,
                                  host_name)
from folio.frontend.metrics import Metrics
from folio.frontend.openai_api import create_chat_completion, create_completion
from folio.frontend.openai_protocol import ApiError, invalid, served_names
from folio.frontend.openai_tokenize import detokenize, tokenize

log = logging.getLogger("folio.frontend")
MAX_BODY_BYTES = 4 * 2**20
RETRY_AFTER_S = "1"


def create_app(engine: EngineClient, model_name: str | list[str], api_key: str | None = None,
               metrics_public: bool = False, hosts: frozenset[str] | None = None,
               tool_call_parser: str | None = None) -> FastAPI:
    """With api_key, /v1 routes need it, and so does /metrics unless metrics_public.
    Several model names: each is accepted, the first is the one answers report.
    hosts: the Host names answered (None: any); others get a 403."""
    # No /openapi.json: it would answer without the API key.
    app = FastAPI(title="Folio", version="1", docs_url=None, redoc_url=None,
                  openapi_url=None)
    names = [model_name] if isinstance(model_name, str) else list(model_name)
    model_name = names[0]
    metrics = Metrics(model_name)
    engine.observers.append(metrics.observe)
    created = int(time.time())

    @app.exception_handler(StarletteHTTPException)
    async def http_error(_: Request, error: StarletteHTTPException) -> JSONResponse:
        envelope = ApiError(error.status_code, str(error.detail),
                            code="not_found" if error.status_code == 404 else None,
                            error_type="not_found_error" if error.status_code == 404
                            else "invalid_request_error")
        return JSONResponse(envelope.body(), status_code=error.status_code,
                            headers=getattr(error, "headers", None))

    @app.exception_handler(ClientDisconnect)
    async def client_gone(_: Request, __: ClientDisconnect) -> Response:
        # The client closed (or was closed: the request deadline) before its body was
        # whole: nobody reads an answer, and it is no server error worth a traceback.
        return Response(status_code=499)

    @app.exception_handler(ApiError)
    async def api_error(_: Request, error: ApiError) -> JSONResponse:
        headers = {"Retry-After": RETRY_AFTER_S} if error.status == 503 else None
        return JSONResponse(error.body(), status_code=error.status, headers=headers)

    def needs_key(path: str) -> bool:
        return (path.startswith("/v1") or path in ("/tokenize", "/detokenize")
                or (path == "/metrics" and not metrics_public))

    app.add_middleware(AccessGate, hosts=hosts, api_key=api_key, needs_key=needs_key)

    async def read_json(request: Request) -> dict[str, Any]:
        raw = await _read_body(request)
        try:
            body = json.loads(raw)
        except (ValueError, RecursionError) as error:
            raise invalid(f"request body is not valid JSON: {error}") from None
        if not isinstance(body, dict):
            raise invalid("request body must be a JSON object")
        try:   # JSON may carry lone surrogates ("\\ud800"); nothing downstream can encode them
            json.dumps(body, ensure_ascii=False).encode("utf-8")
        except UnicodeEncodeError:
            raise invalid("request body contains text that is not valid Unicode "
                          "(a lone surrogate)") from None
        name = body.get("model")
        if name is not None and name not in names:
            raise unknown_model(name)
        return body

    async def answer(handler, body: dict[str, Any]):
        job, result = await handler(engine, body, model_name)
        if isinstance(result, (dict, Response)):   # a Response: a body built in pieces
            return job, result, None
        try:   # the first chunk waits for the engine's first answer, which may be a refusal
            return job, result, await result.__anext__()
        except BaseException:
            job.abort()
            raise

    async def respond(request: Request, handler, body: dict[str, Any]) -> Response:
        work = asyncio.create_task(answer(handler, body))
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
        return StreamingResponse(_guarded(job, result, first), media_type="text/event-stream",
                                 headers={"Cache-Control": "no-cache"})

    def unknown_model(name: Any) -> ApiError:
        return ApiError(404, f"the model {name!r} does not exist; this server serves "
                        f"{', '.join(map(repr, names))}", "model", "model_not_found")

    def card(name: str) -> dict[str, Any]:
        return {"id": name, "object": "model", "created": created, "owned_by": "folio",
                "max_model_len": engine.max_model_len}

    @app.get("/v1/models")
    async def models() -> dict[str, Any]:
        return {"object": "list", "data": [card(name) for name in names]}

    @app.get("/v1/models/{name:path}")
    async def model(name: str) -> dict[str, Any]:
        if name not in names:
            raise unknown_model(name)
        return card(name)

    @app.post("/tokenize")
    async def tokenize_route(request: Request) -> dict[str, Any]:
        return await tokenize(engine, await read_json(request))

    @app.post("/detokenize")
    async def detokenize_route(request: Request) -> dict[str, Any]:
        return await detokenize(engine, await read_json(request))

    @app.post("/v1/completions")
    async def completions(request: Request) -> Response:
        return await respond(request, create_completion, await read_json(request))

    @app.post("/v1/chat/completions")
    async def chat_completions(request: Request) -> Response:
        return await respond(request, functools.partial(
            create_chat_completion, tool_parser=tool_call_parser), await read_json(request))

    @app.get("/health")
    async def health() -> Response:
        if engine.draining:
            return JSONResponse({"status": "draining", "reason": "the server is shutting down"},
                                status_code=503, headers={"Retry-After": RETRY_AFTER_S})
        # Data-parallel replicas: healthy while one serves; the body lists each. A
        # tensor-parallel executor lists its ranks (under each replica, with replicas).
        details = ({"replicas": engine.replica_health()}
                   if hasattr(engine, "replica_health") else {})
        ranks = engine.rank_health() if hasattr(engine, "rank_health") else []
        if ranks:
            details["ranks"] = ranks
        if engine.engine_alive:
            return JSONResponse({"status": "ok", **details})
        return JSONResponse({"status": "unhealthy", "reason": engine.dead_reason(),
                             **details},
                            status_code=503, headers={"Retry-After": RETRY_AFTER_S})

    @app.get("/metrics")
    async def prometheus() -> Response:
        stats = await engine.stats(timeout=0.5)
        return Response(metrics.render(stats),
                        media_type="text/plain; version=0.0.4; charset=utf-8")

    @app.get("/v1/kv/map")
    async def kv_map() -> Response:
        snapshot = await engine.kv_map(timeout=1.0)
        if snapshot is None:
            raise ApiError(503, "no page map: " + (engine.dead_reason() if not
                           engine.engine_alive else "the scheduler did not answer in time"),
                           code="engine_unavailable")
        return JSONResponse({"object": "kv_map", **snapshot},
                            headers={"Cache-Control": "no-store"})

    @app.get("/kv", response_class=HTMLResponse)
    async def kv_page() -> HTMLResponse:
        page = resources.files("frontend").joinpath("static/kv.html")
        return HTMLResponse(page.read_text(encoding="utf-8"))

    @app.get("/", response_class=HTMLResponse)
    async def chat_page() -> HTMLResponse:
        page = resources.files("frontend").joinpath("static/chat.html")
        return HTMLResponse(page.read_text(encoding="utf-8"))

    return app


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


class AccessGate:
    """Refuses a request for another Host (403) or without the API key (401) before any
    route runs. Plain ASGI, not an `@app.middleware("http")`: that wraps every streamed
    chunk in its own task and memory stream, a quarter of the frontend's CPU per token."""

    def __init__(self, app, hosts: frozenset[str] | None, api_key: str | None,
                 needs_key) -> None:
        self.app, self.hosts, self.needs_key = app, hosts, needs_key
        self.expected = f"Bearer {api_key}".encode() if api_key else None   # "": no key

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] == "http":
            refusal = self.refusal(scope)
            if refusal is not None:
                await refusal(scope, receive, send)
                return
        await self.app(scope, receive, send)

    def refusal(self, scope) -> JSONResponse | None:
        if sum(name == b"host" for name, _ in scope["headers"]) > 1:
            # Proxies and this server could each read a different one (RFC 9112 §3.2: 400).
            error = ApiError(400, "the request has more than one Host header",
                             code="duplicate_host_header")
            return JSONResponse(error.body(), status_code=400)
        headers = dict(reversed(scope["headers"]))   # the first of repeated headers
        host = headers.get(b"host", b"").decode("latin-1")
        if self.hosts is not None and host_name(host) not in self.hosts:
            error = ApiError(403, f"this server does not answer to the Host {host[:100]!r} "
                             "(--allowed-hosts)", code="host_not_allowed",
                             error_type="invalid_request_error")
            return JSONResponse(error.body(), status_code=403)
        if self.expected is not None and self.needs_key(scope["path"]):
            given = headers.get(b"authorization", b"")
            if not hmac.compare_digest(given, self.expected):
                error = ApiError(401, "missing or invalid API key; send "
                                 "'Authorization: Bearer <key>'", code="invalid_api_key")
                return JSONResponse(error.body(), status_code=401)
        return None


async def _wait_disconnect(request: Request) -> None:
    """Returns once the client disconnects: the server's own notice. With the body read,
    uvicorn's receive() sleeps until the connection is lost (or the response is sent), so
    this costs nothing while it waits: no polling, however many requests are queued."""
    while (await request.receive())["type"] != "http.disconnect":
        await asyncio.sleep(0.05)   # not expected once the body is read; never spin


async def _guarded(job, stream, first: str):
    """Pass the SSE stream through. However it ends (done, an error event, the client
    gone), abort what is still running of it: a multi-prompt stream that ends with one
    prompt's error leaves no sibling running unread."""
    try:
        yield first
        async for chunk in stream:
            yield chunk
    finally:
        job.abort()


class _Server(uvicorn.Server):
    def capture_signals(self):   # the frontend process owns SIGINT/SIGTERM
        return contextlib.nullcontext()


def http_config(app, host: str, port: int, gate: ConnectionGate,
                request_timeout_s: float = REQUEST_TIMEOUT_S,
                idle_timeout_s: float = IDLE_TIMEOUT_S,
                max_head_bytes: int = MAX_HEAD_BYTES) -> uvicorn.Config:
    """uvicorn's settings for the API: the connection gate, the whole-request deadline, the
    head size limit and the keep-alive idle timeout (frontend/http_limits.py). The httptools
    protocol, always: the limits hook its parser's callbacks."""
    protocol = gated(import_from_string(HTTP_PROTOCOLS["httptools"]), gate, request_timeout_s,
                     max_head_bytes)
    return uvicorn.Config(app, host=host, port=port, http=protocol, log_level="warning",
                          access_log=False, lifespan="off", timeout_keep_alive=idle_timeout_s,
                          timeout_graceful_shutdown=5)


async def serve_http(engine: EngineClient, config, stopped: asyncio.Event) -> None:
    names = served_names(config.served_model_name, config.model)
    app = create_app(engine, names, config.api_key, config.metrics_public,
                     allowed_hosts(config.host, config.allowed_hosts),
                     getattr(config, "tool_call_parser", None))
    gate = ConnectionGate(connection_cap())
    server = _Server(http_config(app, config.host, config.port, gate))
    task = asyncio.create_task(server.serve())
    log.info("HTTP API on http://%s:%d/v1 (model %s; at most %d connections)", config.host,
             config.port, ", ".join(map(repr, names)), gate.cap)
    await stopped.wait()
    server.should_exit = True
    await task
