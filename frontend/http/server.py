"""The OpenAI-compatible HTTP API (FastAPI on uvicorn, in the frontend's own event loop).

Routes (frontend/http/routes.py): GET /v1/models, GET /v1/models/{id}, POST /v1/completions,
POST /v1/chat/completions, POST /v1/responses (GET, DELETE /v1/responses/{id}), POST
/v1/messages and /v1/messages/count_tokens (Anthropic's), POST /tokenize, POST /detokenize,
GET /health, GET /metrics, GET /v1/kv/map (the KV cache's page map), the chat page at /,
the page map's live view at /kv and a saved capacity plan drawn at /plan (docs/planner.md).
Errors use OpenAI's envelope {"error": {"message", "type", "param", "code"}}; the
/v1/messages routes Anthropic's.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time

import uvicorn
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.requests import ClientDisconnect
from uvicorn.config import HTTP_PROTOCOLS
from uvicorn.importer import import_from_string

from folio.frontend.openai.errors import ApiError
from folio.frontend.engine_api import Engine
from folio.frontend.http.access import AccessGate
from folio.frontend.openai.generic_tools import renders_tools
from folio.frontend.http.limits import (IDLE_TIMEOUT_S, MAX_HEAD_BYTES, REQUEST_TIMEOUT_S,
                                        ConnectionGate, allowed_hosts, connection_cap, gated)
from folio.frontend.http.routes import LORA_ROUTES, RETRY_AFTER_S, ROUTES, Served
from folio.frontend.metrics import Metrics
from folio.frontend.openai.field_parsers import served_names
from folio.frontend.openai.responses.store import ResponseStore
from folio.shared.service_settings import RESPONSES_STORE_SIZE

log = logging.getLogger("folio.frontend")


def create_app(engine: Engine, model_name: str | list[str], api_key: str | None = None,
               metrics_public: bool = False, hosts: frozenset[str] | None = None,
               tool_call_parser: str | None = None,
               lora_runtime_updates: bool = False,
               responses_store_size: int = RESPONSES_STORE_SIZE,
               priority_floor: int | None = None,
               priority_api_key: str | None = None,
               reasoning_parser: str | None = None) -> FastAPI:
    """With api_key, /v1 routes need it, and so does /metrics unless metrics_public.
    Several model names: each is accepted, the first is the one answers report.
    hosts: the Host names answered (None: any); others get a 403."""
    # No /openapi.json: it would answer without the API key.
    app = FastAPI(title="Folio", version="1", docs_url=None, redoc_url=None,
                  openapi_url=None)
    names = (model_name,) if isinstance(model_name, str) else tuple(model_name)
    metrics = Metrics(names[0])
    engine.observers.append(metrics.observe)
    # The template is fixed for the server's life: read whether it renders tools once.
    app.state.served = Served(engine, names, metrics, int(time.time()), tool_call_parser,
                              renders_tools(engine.tokenizer), priority_floor, reasoning_parser)
    app.state.responses = ResponseStore(responses_store_size)   # for /v1/responses
    app.add_exception_handler(StarletteHTTPException, _http_error)
    app.add_exception_handler(ClientDisconnect, _client_gone)
    app.add_exception_handler(ApiError, _api_error)
    for method, path, handler in ROUTES + (LORA_ROUTES if lora_runtime_updates else ()):
        app.add_api_route(path, handler, methods=[method])
    app.add_middleware(AccessGate, hosts=hosts, api_key=api_key,
                       metrics_public=metrics_public, priority_api_key=priority_api_key)
    return app


async def _http_error(_: Request, error: StarletteHTTPException) -> JSONResponse:
    envelope = ApiError(error.status_code, str(error.detail),
                        code="not_found" if error.status_code == 404 else None,
                        error_type="not_found_error" if error.status_code == 404
                        else "invalid_request_error")
    return JSONResponse(envelope.body(), status_code=error.status_code,
                        headers=getattr(error, "headers", None))


async def _client_gone(_: Request, __: ClientDisconnect) -> Response:
    # The client closed (or was closed: the request deadline) before its body was whole:
    # nobody reads an answer, and it is no server error worth a traceback.
    return Response(status_code=499)


async def _api_error(_: Request, error: ApiError) -> JSONResponse:
    headers = {"Retry-After": RETRY_AFTER_S} if error.status == 503 else None
    return JSONResponse(error.body(), status_code=error.status, headers=headers)


class _Server(uvicorn.Server):
    def capture_signals(self):   # the frontend process owns SIGINT/SIGTERM
        return contextlib.nullcontext()


def http_config(app, host: str, port: int, gate: ConnectionGate,
                request_timeout_s: float = REQUEST_TIMEOUT_S,
                idle_timeout_s: float = IDLE_TIMEOUT_S,
                max_head_bytes: int = MAX_HEAD_BYTES) -> uvicorn.Config:
    """uvicorn's settings for the API: the connection gate, the whole-request deadline, the
    head size limit and the keep-alive idle timeout (frontend/http/limits.py). The httptools
    protocol, always: the limits hook its parser's callbacks."""
    protocol = gated(import_from_string(HTTP_PROTOCOLS["httptools"]), gate, request_timeout_s,
                     max_head_bytes)
    return uvicorn.Config(app, host=host, port=port, http=protocol, log_level="warning",
                          access_log=False, lifespan="off", timeout_keep_alive=idle_timeout_s,
                          timeout_graceful_shutdown=5)


async def serve_http(engine: Engine, config, stopped: asyncio.Event) -> None:
    names = served_names(config.served_model_name, config.model)
    app = create_app(engine, names, config.api_key, config.metrics_public,
                     allowed_hosts(config.host, config.allowed_hosts),
                     getattr(config, "tool_call_parser", None),
                     getattr(config, "enable_lora_runtime_updates", False),
                     getattr(config, "responses_store_size", RESPONSES_STORE_SIZE),
                     config.priority_floor, config.priority_api_key,
                     getattr(config, "reasoning_parser", None))
    gate = ConnectionGate(connection_cap())
    server = _Server(http_config(app, config.host, config.port, gate))
    task = asyncio.create_task(server.serve())
    log.info("HTTP API on http://%s:%d/v1 (model %s; at most %d connections)", config.host,
             config.port, ", ".join(map(repr, names)), gate.cap)
    await stopped.wait()
    server.should_exit = True
    await task
