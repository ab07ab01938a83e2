"""A Responses `input` (a string, or a list of items) as chat messages, and a response's
output items as the assistant's chat message (what previous_response_id carries on).

Items honoured: messages (roles user, assistant, system, developer; string content or text
parts), function_call and function_call_output, reasoning (its reasoning_text content, or
else its summary text, becomes the next assistant turn's reasoning_content: the template
renders it or not, frontend/reasoning/history.py); a response's output items sent back as
input (what the agents SDK does) read the same. Anything else is refused by name, and so
is a reasoning item's encrypted_content (only OpenAI can read it).
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
            _add_message(messages, _message(item))
        elif kind == "reasoning":
            messages.append({"role": "assistant", "content": "",
                             "reasoning_content": _reasoning_text(item)})
        elif kind == "function_call":
            _add_call(messages, item)
        elif kind == "function_call_output":
            messages.append({"role": "tool", "tool_call_id": _string(item, "call_id"),
                             "content": _output_text(item.get("output"))})
        else:
            raise invalid(f"input: item type {kind!r} is not supported (message, "
                          "function_call, function_call_output, reasoning)", "input")
    return messages


def _reasoning_text(item: dict[str, Any]) -> str:
    if item.get("encrypted_content") is not None:
        raise invalid("input: a reasoning item's encrypted_content is not supported (only "
                      "OpenAI reads it); send its content", "input")
    for key, part_type in (("content", "reasoning_text"), ("summary", "summary_text")):
        parts = item.get(key) or []
        if not isinstance(parts, list) or not all(
                isinstance(p, dict) and p.get("type") == part_type
                and isinstance(p.get("text"), str) for p in parts):
            raise invalid(f"input: a reasoning item's {key} must be a list of {part_type} "
                          "parts", "input")
        if parts:
            return "\n\n".join(part["text"] for part in parts)
    raise invalid("input: a reasoning item needs its text (content: reasoning_text parts, "
                  "or summary: summary_text parts)", "input")


def _add_message(messages: list[dict[str, Any]], message: dict[str, Any]) -> None:
    """An assistant message after a reasoning item is the same turn: it joins it."""
    last = messages[-1] if messages else None
    if message["role"] == "assistant" and last is not None and last["role"] == "assistant" \
            and "reasoning_content" in last and not last["content"] \
            and "tool_calls" not in last:
        last["content"] = message["content"]
    else:
        messages.append(message)


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
    reasoning = [part["text"] for item in output if item["type"] == "reasoning"
                 for part in item["content"]]
    if not text and not calls and not output:
        return None
    message: dict[str, Any] = {"role": "assistant", "content": text}
    if reasoning:
        message["reasoning_content"] = "\n\n".join(reasoning)
    if calls:
        message["tool_calls"] = calls
    return message
