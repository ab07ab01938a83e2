"""Who may reach the HTTP API's routes: the Host names it answers (403 otherwise) and the
API key (401 without it; as a bearer token or, Anthropic's way, `x-api-key`), checked
before any route runs; and who is asking: the client a request counts for (client_of) and
whether its key lets it ask any priority."""

from __future__ import annotations

import hmac

from fastapi.responses import JSONResponse

from folio.frontend.anthropic.errors import PATH_PREFIX as ANTHROPIC_PATHS
from folio.frontend.anthropic.errors import error_response
from folio.frontend.openai.errors import ApiError
from folio.frontend.http.limits import host_name


PRIVILEGED = "folio.priority_key"   # scope key: the request came with --priority-api-key


def client_of(scope) -> str:
    """The client a request counts for, in the scheduler's turns between clients: its peer's
    address (every connection from one host is one client), apart for the priority key's
    holders. Behind a proxy every request is the proxy's: one client."""
    peer = scope.get("client")
    host = peer[0] if peer else "unknown"
    return f"priority-key@{host}" if scope.get(PRIVILEGED) else host


def priority_problem(priority: int, floor: int, privileged: bool) -> str | None:
    """Why a request may not ask this priority (lower is more urgent); None: it may."""
    if priority >= floor or privileged:
        return None
    return (f"priority {priority} is more urgent than this server lets a request ask "
            f"(--priority-floor {floor}); ask {floor} or more (over HTTP, requests with the "
            "priority API key may ask more)")


def needs_key(path: str, metrics_public: bool) -> bool:
    """The API and the tokenizer routes need the key, and /metrics unless metrics_public;
    /health and the pages do not."""
    return (path.startswith("/v1") or path in ("/tokenize", "/detokenize")
            or (path == "/metrics" and not metrics_public))


class AccessGate:
    """Refuses a request for another Host (403) or without the API key (401) before any
    route runs. Plain ASGI, not an `@app.middleware("http")`: that wraps every streamed
    chunk in its own task and memory stream, a quarter of the frontend's CPU per token.
    hosts None: any Host; api_key None or "": no key."""

    def __init__(self, app, hosts: frozenset[str] | None, api_key: str | None,
                 metrics_public: bool, priority_api_key: str | None = None) -> None:
        self.app, self.hosts, self.metrics_public = app, hosts, metrics_public
        self.expected = f"Bearer {api_key}".encode() if api_key else None
        # Anthropic's clients send the key as `x-api-key` (frontend/anthropic).
        self.expected_key = api_key.encode() if api_key else None
        self.privileged = f"Bearer {priority_api_key}".encode() if priority_api_key else None

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
        given = headers.get(b"authorization", b"")
        privileged = self.privileged is not None and hmac.compare_digest(given,
                                                                         self.privileged)
        scope[PRIVILEGED] = privileged
        if self.expected is not None and needs_key(scope["path"], self.metrics_public):
            other = headers.get(b"x-api-key")
            if not privileged and not hmac.compare_digest(given, self.expected) and not (
                    other is not None and hmac.compare_digest(other, self.expected_key)):
                error = ApiError(401, "missing or invalid API key; send "
                                 "'Authorization: Bearer <key>' or 'x-api-key: <key>'",
                                 code="invalid_api_key")
                if scope["path"].startswith(ANTHROPIC_PATHS):
                    return error_response(error)
                return JSONResponse(error.body(), status_code=401)
        return None
