"""POST /v1/messages and POST /v1/messages/count_tokens. Each request runs as a chat
completion (frontend/chat_bridge.py); every refusal, whoever raised it, answers in
Anthropic's error shape (frontend/anthropic/errors.py)."""

from __future__ import annotations

from typing import Any

from fastapi.responses import JSONResponse, Response
from starlette.requests import Request

from folio.frontend.anthropic.answer import whole_message
from folio.frontend.anthropic.errors import error_response
from folio.frontend.anthropic.request import RENAMES, MessagesRequest
from folio.frontend.anthropic.stream import message_events
from folio.frontend.chat_bridge import (parse_chat, prompt_tokens, renamed, run_chat,
                                        served_model)
from folio.frontend.http.answers import respond
from folio.frontend.http.body import read_json
from folio.frontend.input_processor import InputError
from folio.frontend.openai.errors import ApiError, invalid
from folio.frontend.reasoning.history import for_template


async def create_message(request: Request) -> Response:
    try:
        return await _create(request)
    except ApiError as error:
        return error_response(renamed(error, RENAMES))


async def count_tokens(request: Request) -> Response:
    try:
        return JSONResponse(await _count(request))
    except ApiError as error:
        return error_response(renamed(error, RENAMES))


async def _create(request: Request) -> Response:
    served = request.app.state.served
    body = await read_json(request)
    model, lora = served_model(served, body.get("model"))
    parsed = MessagesRequest.parse(body, reasoning_parser=served.reasoning_parser)
    chat = parse_chat(served, parsed.chat, lora)

    async def answer():
        job, result = await run_chat(served, chat, model)
        if isinstance(result, dict):
            return job, whole_message(model, result, parsed.stop_sequences)
        return job, message_events(model, prompt_tokens(job), result, parsed.stop_sequences)

    return await respond(request, answer())


async def _count(request: Request) -> dict[str, Any]:
    """The prompt's tokens as /v1/messages would send them: the same chat template, with
    the same tools, through the same input processor."""
    served = request.app.state.served
    body = await read_json(request)
    _, lora = served_model(served, body.get("model"))
    chat = parse_chat(served, MessagesRequest.parse(body, True, served.reasoning_parser).chat,
                      lora)
    engine, tools = served.engine, chat.tools
    try:
        engine.inputs.check_text(chat.chars, engine.facts, "messages")
        messages = for_template(tools.messages(chat.messages), chat.reasoning_parser)
        ids = await engine.prep.run(chat.chars, _template_ids, engine.inputs, messages,
                                    tools.template_tools, chat.template_kwargs)
    except InputError as error:
        raise invalid(error.message, error.param) from None
    return {"input_tokens": len(ids)}


def _template_ids(inputs, messages: list[dict[str, Any]], tools,
                  template_kwargs: dict[str, Any]) -> list[int]:
    return inputs.tokenize(messages=messages, tools=tools, param="messages",
                           template_kwargs=template_kwargs)


# (method, path, handler), added beside frontend/http/routes.py's ROUTES
MESSAGES_ROUTES = (
    ("POST", "/v1/messages", create_message),
    ("POST", "/v1/messages/count_tokens", count_tokens),
)
