"""The HTTP API's routes, as plain handlers. What they serve (the engine client, the model's
names, the metrics, the tool-call parser) is the app's `Served`, in `app.state.served`;
frontend/http/server.py's `create_app` puts it there and adds ROUTES.

Each POST body is read within bounds (frontend/http/body.py), its `model` checked against
the names served, then parsed once into its typed request (frontend/openai/requests.py).
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, replace
from importlib import resources
from typing import Any

from fastapi.responses import HTMLResponse, JSONResponse, Response
from starlette.requests import Request

from folio.executor.lora.files import LoraError, check_adapter_files, lora_name_problem
from folio.frontend.anthropic.routes import MESSAGES_ROUTES
from folio.frontend.http.access import PRIVILEGED, client_of, priority_problem
from folio.frontend.openai.errors import ApiError, invalid
from folio.frontend.engine_api import Engine
from folio.frontend.http.answers import respond
from folio.frontend.http.body import read_json
from folio.frontend.metrics import Metrics
from folio.frontend.openai.completions import create_chat_completion, create_completion
from folio.frontend.openai.requests import (ChatRequest, CompletionRequest, DetokenizeRequest,
                                            ServerTerms, TokenizeRequest)
from folio.frontend.openai.responses.routes import RESPONSES_ROUTES
from folio.frontend.openai.pooling.routes import POOLING_ENDPOINTS
from folio.frontend.openai.tokenize_routes import detokenize, tokenize
from folio.shared.sampling_params import MAX_LORA_NAME_CHARS
from folio.shared.protocol.frontend_scheduler import MAX_LORA_PATH_CHARS

RETRY_AFTER_S = "1"
# Reading a LoRA adapter's files before the engine is asked: a hung filesystem answers 400.
LORA_CHECK_TIMEOUT_S = 10.0


@dataclass(frozen=True)
class Served:
    """What the routes serve. Several names: each is accepted, the first is the one
    answers report."""

    engine: Engine
    names: tuple[str, ...]
    metrics: Metrics
    created: int                    # the models' "created" time
    tool_call_parser: str | None
    renders_tools: bool             # the chat template reads `tools` (frontend/openai/generic_tools.py)
    priority_floor: int | None = None   # --priority-floor; None: any priority (tests' apps)
    reasoning_parser: str | None = None   # --reasoning-parser (frontend/reasoning/)

    @property
    def model(self) -> str:
        return self.names[0]

    def terms(self) -> ServerTerms:
        return ServerTerms(self.engine.facts.max_logprobs, self.tool_call_parser,
                           self.renders_tools, self.reasoning_parser)


def _served(request: Request) -> Served:
    return request.app.state.served


def _unknown_model(served: Served, name: Any) -> ApiError:
    names = [*served.names, *served.engine.loras]
    return ApiError(404, f"the model {name!r} does not exist; this server serves "
                    f"{', '.join(map(repr, names))}", "model", "model_not_found")


async def _body(request: Request) -> dict[str, Any]:
    """The JSON body, its `model` (when given) one of the names served or an adapter."""
    body = await read_json(request, getattr(_served(request).engine, "prep", None))
    name = body.get("model")
    served = _served(request)
    if name is not None and name not in served.names and name not in served.engine.loras:
        raise _unknown_model(served, name)
    return body


def _adapter(served: Served, body: dict[str, Any]) -> str | None:
    """The LoRA adapter the body's `model` names (docs/lora.md); None: the base model."""
    name = body.get("model")
    return None if name is None or name in served.names else name


def _card(served: Served, name: str, parent: str | None = None) -> dict[str, Any]:
    return {"id": name, "object": "model", "created": served.created, "owned_by": "folio",
            "max_model_len": served.engine.max_model_len, "root": name, "parent": parent}


async def list_models(request: Request) -> dict[str, Any]:
    served = _served(request)
    return {"object": "list", "data": [_card(served, name) for name in served.names]
            + [_card(served, name, served.model) for name in served.engine.loras]}


async def get_model(request: Request, name: str) -> dict[str, Any]:
    served = _served(request)
    if name in served.names:
        return _card(served, name)
    if name in served.engine.loras:
        return _card(served, name, served.model)
    raise _unknown_model(served, name)


async def completions(request: Request) -> Response:
    served = _served(request)
    body = await _body(request)
    parsed, model = _for_model(served, body, CompletionRequest.parse(body, served.terms()))
    parsed = _from_client(request, served, parsed)
    return await respond(request, create_completion(served.engine, parsed, model))


async def chat_completions(request: Request) -> Response:
    served = _served(request)
    body = await _body(request)
    parsed, model = _for_model(served, body, ChatRequest.parse(body, served.terms()))
    parsed = _from_client(request, served, parsed)
    return await respond(request, create_chat_completion(served.engine, parsed, model))


def _pooling(parse, create):
    """A pooling endpoint's handler (frontend/openai/pooling/)."""
    async def handler(request: Request) -> dict[str, Any]:
        served = _served(request)
        body = await _body(request)
        lora = _adapter(served, body)
        return await create(served.engine, parse(body), lora or served.model, lora)
    return handler
def _from_client(request: Request, served: Served, parsed):
    """The parsed request marked with its client; a priority more urgent than its client
    may ask is refused (400) here, before anything is queued."""
    scope = request.scope
    if served.priority_floor is not None:
        problem = priority_problem(parsed.params.priority, served.priority_floor,
                                   bool(scope.get(PRIVILEGED)))
        if problem is not None:
            raise invalid(problem, "priority")
    return replace(parsed, client=client_of(scope))


def _for_model(served, body: dict, parsed):
    """The parsed request for the LoRA adapter its `model` names (if any), and the model
    name its answer carries."""
    lora = _adapter(served, body)
    if lora is None:
        return parsed, served.model
    return replace(parsed, params=replace(parsed.params, lora=lora)), lora


async def tokenize_route(request: Request) -> dict[str, Any]:
    parsed = TokenizeRequest.parse(await _body(request))
    return await tokenize(_served(request).engine, parsed)


async def detokenize_route(request: Request) -> dict[str, Any]:
    parsed = DetokenizeRequest.parse(await _body(request))
    return await detokenize(_served(request).engine, parsed)


async def health(request: Request) -> Response:
    engine = _served(request).engine
    if engine.draining:
        return JSONResponse({"status": "draining", "reason": "the server is shutting down"},
                            status_code=503, headers={"Retry-After": RETRY_AFTER_S})
    # Data-parallel replicas: healthy while one serves; the body lists each. A
    # tensor-parallel executor lists its ranks (under each replica, with replicas).
    replicas, ranks = engine.replica_health(), engine.rank_health()
    details: dict[str, Any] = {} if replicas is None else {"replicas": replicas}
    if ranks:
        details["ranks"] = ranks
    if engine.engine_alive:
        return JSONResponse({"status": "ok", **details})
    return JSONResponse({"status": "unhealthy", "reason": engine.dead_reason(), **details},
                        status_code=503, headers={"Retry-After": RETRY_AFTER_S})


async def prometheus(request: Request) -> Response:
    served = _served(request)
    stats = await served.engine.stats(timeout=0.5)
    return Response(served.metrics.render(stats),
                    media_type="text/plain; version=0.0.4; charset=utf-8")


async def kv_map(request: Request) -> Response:
    engine = _served(request).engine
    snapshot = await engine.kv_map(timeout=1.0)
    if snapshot is None:
        raise ApiError(503, "no page map: " + (engine.dead_reason() if not
                       engine.engine_alive else "the scheduler did not answer in time"),
                       code="engine_unavailable")
    return JSONResponse({"object": "kv_map", **snapshot}, headers={"Cache-Control": "no-store"})


def _page(name: str) -> HTMLResponse:
    page = resources.files("folio.frontend.http").joinpath(f"static/{name}")
    return HTMLResponse(page.read_text(encoding="utf-8"))


async def load_lora_adapter(request: Request) -> Response:
    """vLLM's POST /v1/load_lora_adapter {"lora_name", "lora_path"} (docs/lora.md)."""
    served = _served(request)
    body = await read_json(request, getattr(_served(request).engine, "prep", None))
    name, path = _lora_field(body, "lora_name"), _lora_field(body, "lora_path")
    _only_fields(body, ("lora_name", "lora_path"))
    if name in served.names:
        raise ApiError(400, f"lora_name {name!r} is the base model's name", "lora_name")
    problem = lora_name_problem(name)
    if problem is not None:
        raise ApiError(400, problem, "lora_name")
    await _check_adapter_files(name, path)
    error = await served.engine.update_lora(name, path)
    if error is not None:
        raise ApiError(400, error, "lora_path")
    return Response(f"Success: LoRA adapter '{name}' added successfully.", media_type="text/plain")


async def _check_adapter_files(name: str, path: str) -> None:
    """The adapter's files read and checked in a worker thread, time-bounded, before the
    engine is asked: a bad file is a 400 here, and the event loop keeps streaming."""
    try:
        await asyncio.wait_for(asyncio.to_thread(check_adapter_files, name, path),
                               LORA_CHECK_TIMEOUT_S)
    except LoraError as error:
        raise ApiError(400, str(error), "lora_path") from None
    except TimeoutError:
        raise ApiError(400, f"reading the adapter at {path!r} took over "
                       f"{LORA_CHECK_TIMEOUT_S:g} s", "lora_path") from None


async def unload_lora_adapter(request: Request) -> Response:
    """vLLM's POST /v1/unload_lora_adapter {"lora_name"}: refused (400, naming how many)
    while unfinished requests use the adapter."""
    served = _served(request)
    body = await read_json(request, getattr(_served(request).engine, "prep", None))
    name = _lora_field(body, "lora_name")
    _only_fields(body, ("lora_name", "lora_int_id"))
    if name not in served.engine.loras:
        raise ApiError(404, f"no LoRA adapter named {name!r} is loaded", "lora_name",
                       "model_not_found")
    error = await served.engine.update_lora(name, None)
    if error is not None:
        raise ApiError(400, error, "lora_name")
    return Response(f"Success: LoRA adapter '{name}' removed successfully.",
                    media_type="text/plain")


def _lora_field(body: dict[str, Any], key: str) -> str:
    value = body.get(key)
    if not isinstance(value, str) or not value or len(value) > MAX_LORA_PATH_CHARS:
        raise ApiError(400, f"{key} must be a non-empty string", key)
    if key == "lora_name" and len(value) > MAX_LORA_NAME_CHARS:
        raise ApiError(400, f"lora_name must be at most {MAX_LORA_NAME_CHARS} characters",
                       key)
    return value


def _only_fields(body: dict[str, Any], known: tuple[str, ...]) -> None:
    unknown = sorted(set(body) - set(known))
    if unknown:
        raise ApiError(400, f"unsupported field(s): {', '.join(unknown)}", unknown[0])


async def kv_page() -> HTMLResponse:
    return _page("kv.html")


async def plan_page() -> HTMLResponse:
    return _page("plan.html")   # drawn from a `folio plan --save` file the user picks


async def chat_page() -> HTMLResponse:
    return _page("chat.html")


# (method, path, handler)
ROUTES = (
    ("GET", "/v1/models", list_models),
    ("GET", "/v1/models/{name:path}", get_model),
    ("POST", "/v1/completions", completions),
    ("POST", "/v1/chat/completions", chat_completions),
    ("POST", "/tokenize", tokenize_route),
    ("POST", "/detokenize", detokenize_route),
    ("GET", "/health", health),
    ("GET", "/metrics", prometheus),
    ("GET", "/v1/kv/map", kv_map),
    ("GET", "/kv", kv_page),
    ("GET", "/plan", plan_page),
    ("GET", "/", chat_page),
    *(("POST", path, _pooling(parse, create)) for path, parse, create in POOLING_ENDPOINTS),
) + RESPONSES_ROUTES + MESSAGES_ROUTES   # OpenAI Responses, Anthropic Messages
# Only with --enable-lora-runtime-updates (else 404, as vLLM without its variable).
LORA_ROUTES = (
    ("POST", "/v1/load_lora_adapter", load_lora_adapter),
    ("POST", "/v1/unload_lora_adapter", unload_lora_adapter),
)
