"""A chat completion as an Anthropic message: its reasoning as a thinking block (signature
"": Folio signs nothing, and reads back whatever thinking it is sent), then its text and
tool calls as content blocks, its
finish reason as stop_reason (end_turn, max_tokens, stop_sequence with the sequence,
tool_use), its usage as input and output tokens."""

from __future__ import annotations

import json
import uuid
from typing import Any


def new_message_id() -> str:
    return f"msg_{uuid.uuid4().hex}"


def tool_use_id(call_id: str) -> str:
    """The chat path's call id (call_…) in Anthropic's form (toolu_…)."""
    return "toolu_" + call_id.removeprefix("call_")


def thinking_block(thinking: str) -> dict[str, Any]:
    return {"type": "thinking", "thinking": thinking, "signature": ""}


def tool_input(arguments: str) -> dict[str, Any]:
    """A call's arguments as the object tool_use.input is. The grammar-held calls are
    always JSON objects; one parsed from free text that is not becomes {} rather than a
    server error."""
    try:
        value = json.loads(arguments) if arguments.strip() else {}
    except ValueError:
        return {}
    return value if isinstance(value, dict) else {}


def stop_reason(finish: str | None, chat_stop: Any, called: bool,
                stop_sequences: tuple[str, ...]) -> tuple[str, str | None]:
    """(stop_reason, stop_sequence) from the chat finish_reason and stop_reason."""
    if called:
        return "tool_use", None
    if finish == "length":
        return "max_tokens", None
    if isinstance(chat_stop, str) and chat_stop in stop_sequences:
        return "stop_sequence", chat_stop
    return "end_turn", None


def message(message_id: str, model: str, content: list[dict[str, Any]],
            reason: tuple[str, str | None] | None, usage: dict[str, int]) -> dict[str, Any]:
    return {"id": message_id, "type": "message", "role": "assistant", "model": model,
            "content": content, "stop_reason": reason and reason[0],
            "stop_sequence": reason and reason[1], "usage": usage}


def usage_of(input_tokens: int, output_tokens: int) -> dict[str, int]:
    return {"input_tokens": input_tokens, "output_tokens": output_tokens,
            "cache_creation_input_tokens": 0, "cache_read_input_tokens": 0}


def whole_message(model: str, completion: dict[str, Any],
                  stop_sequences: tuple[str, ...]) -> dict[str, Any]:
    choice = completion["choices"][0]
    chat = choice["message"]
    calls = chat.get("tool_calls") or []
    content: list[dict[str, Any]] = []
    if chat.get("reasoning_content"):
        content.append(thinking_block(chat["reasoning_content"]))
    if chat.get("content") or not calls:
        content.append({"type": "text", "text": chat.get("content") or ""})
    for call in calls:
        content.append({"type": "tool_use", "id": tool_use_id(call["id"]),
                        "name": call["function"]["name"],
                        "input": tool_input(call["function"]["arguments"])})
    reason = stop_reason(choice["finish_reason"], choice.get("stop_reason"), bool(calls),
                         stop_sequences)
    usage = completion["usage"]
    return message(new_message_id(), model, content, reason,
                   usage_of(usage["prompt_tokens"], usage["completion_tokens"]))
