"""Response objects: the chat path's answer as Responses output items, and the object
itself, whole or (streamed) as it stands."""

from __future__ import annotations

import time
import uuid
from dataclasses import dataclass, field
from typing import Any


def new_id(prefix: str) -> str:
    return f"{prefix}_{uuid.uuid4().hex}"


@dataclass
class ResponseHead:
    """What a Response object carries besides its output: its id, model, creation time and
    the request fields it echoes."""

    model: str
    echo: dict[str, Any]
    id: str = field(default_factory=lambda: new_id("resp"))
    created_at: int = field(default_factory=lambda: int(time.time()))

    def response(self, status: str, output: list[dict[str, Any]],
                 usage: dict[str, Any] | None) -> dict[str, Any]:
        return {"id": self.id, "object": "response", "created_at": self.created_at,
                "status": status, "error": None,
                "incomplete_details": ({"reason": "max_output_tokens"}
                                       if status == "incomplete" else None),
                "model": self.model, "output": output, "usage": usage, **self.echo}


def status_of(finish: str | None) -> str:
    return "incomplete" if finish == "length" else "completed"


def usage_of(chat_usage: dict[str, Any]) -> dict[str, Any]:
    reasoning = (chat_usage.get("completion_tokens_details") or {}).get("reasoning_tokens", 0)
    return {"input_tokens": chat_usage["prompt_tokens"],
            "input_tokens_details": {"cached_tokens": 0},
            "output_tokens": chat_usage["completion_tokens"],
            "output_tokens_details": {"reasoning_tokens": reasoning},
            "total_tokens": chat_usage["total_tokens"]}


def text_part(text: str, logprobs: list[dict[str, Any]] | None) -> dict[str, Any]:
    return {"type": "output_text", "text": text, "annotations": [],
            "logprobs": logprobs or []}


def message_item(item_id: str, status: str, content: list[dict[str, Any]]) -> dict[str, Any]:
    return {"type": "message", "id": item_id, "status": status, "role": "assistant",
            "content": content}


def reasoning_part(text: str) -> dict[str, Any]:
    return {"type": "reasoning_text", "text": text}


def reasoning_item(item_id: str, status: str, content: list[dict[str, Any]]
                   ) -> dict[str, Any]:
    """The reasoning text itself (content), no summary, nothing encrypted."""
    return {"type": "reasoning", "id": item_id, "status": status, "summary": [],
            "content": content, "encrypted_content": None}


def call_item(item_id: str, call_id: str, name: str, arguments: str, status: str
              ) -> dict[str, Any]:
    return {"type": "function_call", "id": item_id, "call_id": call_id, "name": name,
            "arguments": arguments, "status": status}


def output_items(completion: dict[str, Any]) -> tuple[list[dict[str, Any]], str | None]:
    """(the output items of a chat completion's one choice, its finish reason)."""
    choice = completion["choices"][0]
    message = choice["message"]
    calls = message.get("tool_calls") or []
    items = []
    if message.get("reasoning_content"):
        items.append(reasoning_item(new_id("rs"), "completed",
                                    [reasoning_part(message["reasoning_content"])]))
    text = message.get("content")
    if text or (text is not None and not calls):
        logprobs = (choice.get("logprobs") or {}).get("content")
        items.append(message_item(new_id("msg"), "completed", [text_part(text, logprobs)]))
    for call in calls:
        items.append(call_item(new_id("fc"), call["id"], call["function"]["name"],
                               call["function"]["arguments"], "completed"))
    return items, choice["finish_reason"]


def whole_response(head: ResponseHead, completion: dict[str, Any]) -> dict[str, Any]:
    items, finish = output_items(completion)
    return head.response(status_of(finish), items, usage_of(completion["usage"]))
