"""Other APIs' requests (OpenAI Responses, Anthropic Messages) run as chat completions.

Each of those routes translates its body into a /v1/chat/completions body and hands it to
the chat path unchanged (ChatRequest.parse, create_chat_completion): one engine path, so
templates, grammar-forced tool calls, structured output, logprobs, stop strings and
streaming behave the same through every API. What comes back is translated again: the
chat completion's dict, or its SSE chunks as dicts. The chat path's refusals name chat
fields; `renamed` puts the caller's own field names in their place.
"""

from __future__ import annotations

import json
import re
from collections.abc import AsyncIterator, Mapping
from dataclasses import replace
from typing import Any

from folio.frontend.openai.completions import create_chat_completion
from folio.frontend.openai.errors import ApiError
from folio.frontend.openai.requests import ChatRequest

_SSE_DATA = len("data: ")


def served_model(served, name: Any) -> tuple[str, str | None]:
    """(the model name answers carry, the LoRA adapter `name` asks for or None); a name
    this server does not serve is a 404 naming it."""
    if name is None or name in served.names:
        return served.model, None
    if isinstance(name, str) and name in served.engine.loras:
        return name, name
    names = [*served.names, *served.engine.loras]
    raise ApiError(404, f"the model {name!r} does not exist; this server serves "
                   f"{', '.join(map(repr, names))}", "model", "model_not_found")


def parse_chat(served, chat_body: dict[str, Any], lora: str | None) -> ChatRequest:
    """The chat path's own parse of a translated body (for the adapter `lora`)."""
    parsed = ChatRequest.parse(chat_body, served.terms())
    if lora is None:
        return parsed
    return replace(parsed, params=replace(parsed.params, lora=lora))


async def run_chat(served, request: ChatRequest, model: str):
    """(the job, the chat completion dict or an async iterator of its chunks as dicts)."""
    job, answer = await create_chat_completion(served.engine, request, model)
    if isinstance(answer, dict):
        return job, answer
    return job, _chunks(answer)


async def _chunks(stream: AsyncIterator[str]) -> AsyncIterator[dict[str, Any]]:
    # Each item is one `data: {...}\n\n` event (frontend/openai/completions.py's _sse).
    async for event in stream:
        payload = event[_SSE_DATA:].strip()
        if payload == "[DONE]":
            return
        yield json.loads(payload)


def prompt_tokens(job) -> int:
    return len(job.prompt_ids[0])


def renamed(error: ApiError, names: Mapping[str, str]) -> ApiError:
    """The chat path's refusal with the caller's field names (`names`: chat -> theirs)."""
    # In the message, only identifiers (max_completion_tokens): a plain word such as
    # "messages" is also English there, and `param` names the field exactly anyway.
    words = [name for name in names if "_" in name]
    message = error.message
    if words:
        pattern = re.compile(r"\b(" + "|".join(map(re.escape, words)) + r")\b")
        message = pattern.sub(lambda match: names[match.group(1)], message)
    param = names.get(error.param, error.param) if error.param else error.param
    return ApiError(error.status, message, param, error.code, error.type)
