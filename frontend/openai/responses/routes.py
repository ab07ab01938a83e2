"""POST /v1/responses, GET and DELETE /v1/responses/{response_id}.

The request runs as a chat completion (frontend/chat_bridge.py); its answer is turned into
a Response object or event stream, and, unless `store` is false, kept in the app's
response store (`app.state.responses`, frontend/openai/responses/store.py) with the
conversation it ends, which previous_response_id carries on."""

from __future__ import annotations

from typing import Any

from fastapi.responses import Response
from starlette.requests import Request

from folio.frontend.chat_bridge import parse_chat, renamed, run_chat, served_model
from folio.frontend.http.answers import respond
from folio.frontend.http.body import read_json
from folio.frontend.openai.errors import ApiError
from folio.frontend.openai.responses.answer import ResponseHead, whole_response
from folio.frontend.openai.responses.input_items import output_message
from folio.frontend.openai.responses.request import RENAMES, ResponsesRequest
from folio.frontend.openai.responses.store import ResponseStore, Stored
from folio.frontend.openai.responses.stream import response_events


def _store(request: Request) -> ResponseStore:
    return request.app.state.responses


def _not_stored(response_id: str, param: str | None, store: ResponseStore) -> ApiError:
    return ApiError(404, f"no stored response has the id {response_id!r}: unknown, deleted, "
                    f"asked for with store false, or evicted (this server keeps the last "
                    f"{store.size} responses, --responses-store-size)", param, "not_found")


async def create_response(request: Request) -> Response:
    served, store = request.app.state.served, _store(request)
    body = await read_json(request)
    model, lora = served_model(served, body.get("model"))
    parsed = ResponsesRequest.parse(body)
    history: list[dict[str, Any]] = []
    if parsed.previous_response_id is not None:
        previous = store.get(parsed.previous_response_id)
        if previous is None:
            raise _not_stored(parsed.previous_response_id, "previous_response_id", store)
        history = previous.messages
    try:
        chat = parse_chat(served, parsed.chat_body(history), lora)
    except ApiError as error:
        raise renamed(error, RENAMES) from None
    head = ResponseHead(model, parsed.echo)
    conversation = history + parsed.input   # what the next turn carries on (no instructions)

    def finished(response: dict[str, Any]) -> None:
        if parsed.store:
            reply = output_message(response["output"])
            store.put(Stored(response, conversation + ([reply] if reply else [])))

    async def answer():
        job, result = await run_chat(served, chat, model)
        if isinstance(result, dict):
            response = whole_response(head, result)
            finished(response)
            return job, response
        return job, response_events(head, result, finished)

    try:
        return await respond(request, answer())
    except ApiError as error:
        raise renamed(error, RENAMES) from None


async def get_response(request: Request, response_id: str) -> dict[str, Any]:
    store = _store(request)
    stored = store.get(response_id)
    if stored is None:
        raise _not_stored(response_id, None, store)
    return stored.response


async def delete_response(request: Request, response_id: str) -> dict[str, Any]:
    store = _store(request)
    if not store.delete(response_id):
        raise _not_stored(response_id, None, store)
    return {"id": response_id, "object": "response.deleted", "deleted": True}


# (method, path, handler), added beside frontend/http/routes.py's ROUTES
RESPONSES_ROUTES = (
    ("POST", "/v1/responses", create_response),
    ("GET", "/v1/responses/{response_id}", get_response),
    ("DELETE", "/v1/responses/{response_id}", delete_response),
)
