"""A Responses `input` (a string, or a list of items) as chat messages, and a response's
output items as the assistant's chat message (what previous_response_id carries on).

Items honoured: messages (roles user, assistant, system, developer; string content or text
parts), function_call and function_call_output; a response's output items sent back as
input (what the agents SDK does) read the same. Anything else is refused by name.
"""

from __future__ import annotations

from typing import Any

from folio.frontend.openai.errors import invalid

_ROLES = {"user": "user", "assistant": "assistant", "system": "system",
          # OpenAI's name for instructions inside the conversation; templates know "system".
          "developer": "system"}
_TEXT_PARTS = ("input_text", "output_text", "text")


def input_messages(value: Any) -> list[dict[str, Any]]:
    if isinstance(value, str):
        return [{"role": "user", "content": value}]
    if not isinstance(value, list) or not value:
        raise invalid("input must be a string or a non-empty list of items", "input")
    messages: list[dict[str, Any]] = []
    for item in value:
        if not isinstance(item, dict):
            raise invalid("input: each item must be an object", "input")
        kind = item.get("type", "message")
        if kind == "message":
            messages.append(_message(item))
        elif kind == "function_call":
            _add_call(messages, item)
        elif kind == "function_call_output":
            messages.append({"role": "tool", "tool_call_id": _string(item, "call_id"),
                             "content": _output_text(item.get("output"))})
        else:
            raise invalid(f"input: item type {kind!r} is not supported (message, "
                          "function_call, function_call_output)", "input")
    return messages


def _string(item: dict[str, Any], key: str) -> str:
    value = item.get(key)
    if not isinstance(value, str) or not value:
        raise invalid(f"input: {item.get('type', 'message')} item needs {key} (a string)",
                      "input")
    return value


def _message(item: dict[str, Any]) -> dict[str, Any]:
    role = item.get("role")
    if not isinstance(role, str) or role not in _ROLES:
        raise invalid(f"input: message role {role!r} is not one of "
                      f"{', '.join(_ROLES)}", "input")
    content = item.get("content")
    if isinstance(content, str):
        return {"role": _ROLES[role], "content": content}
    if not isinstance(content, list):
        raise invalid("input: message content must be a string or a list of parts", "input")
    return {"role": _ROLES[role], "content": "".join(_part_text(part) for part in content)}


def _part_text(part: Any) -> str:
    kind = part.get("type") if isinstance(part, dict) else None
    if kind == "refusal" and isinstance(part.get("refusal"), str):
        return part["refusal"]
    if kind not in _TEXT_PARTS or not isinstance(part.get("text"), str):
        raise invalid(f"input: content part type {kind!r} is not supported (text parts "
                      f"only: {', '.join(_TEXT_PARTS)})", "input")
    return part["text"]


def _output_text(output: Any) -> str:
    if isinstance(output, str):
        return output
    if isinstance(output, list):
        return "".join(_part_text(part) for part in output)
    raise invalid("input: function_call_output needs output (a string or text parts)",
                  "input")


def _add_call(messages: list[dict[str, Any]], item: dict[str, Any]) -> None:
    """A function call joins the assistant message just before it (its text, or the calls
    made in the same turn), as the chat path's one assistant message per turn."""
    arguments = item.get("arguments", "{}")
    if not isinstance(arguments, str):
        raise invalid("input: function_call arguments must be a JSON string", "input")
    call = {"id": _string(item, "call_id"), "type": "function",
            "function": {"name": _string(item, "name"), "arguments": arguments}}
    last = messages[-1] if messages else None
    if last is not None and last["role"] == "assistant":
        last.setdefault("tool_calls", []).append(call)
    else:
        messages.append({"role": "assistant", "content": "", "tool_calls": [call]})


def output_message(output: list[dict[str, Any]]) -> dict[str, Any] | None:
    """The assistant's turn (chat form) that a response's output items make; None if none."""
    text = "".join(part.get("text", "") for item in output if item["type"] == "message"
                   for part in item["content"])
    calls = [{"id": item["call_id"], "type": "function",
              "function": {"name": item["name"], "arguments": item["arguments"]}}
             for item in output if item["type"] == "function_call"]
    if not text and not calls and not output:
        return None
    message: dict[str, Any] = {"role": "assistant", "content": text}
    if calls:
        message["tool_calls"] = calls
    return message
