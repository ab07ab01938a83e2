"""Tools for models whose chat template does not render them (SmolLM2-135M-Instruct's is
one): the frontend writes them into the system message itself, in one generic format, and
the grammar holds the answer to that format, in the spirit of llama.cpp's generic handler.

The system message lists each tool as {"name", "description", "parameters"} (its JSON
schema), then says how to answer:
  auto       one JSON object: {"tool_calls": [{"name": N, "arguments": {...}}, ...]} to
             call tools, or {"response": "text"} to answer in words (the grammar allows
             exactly these two shapes, so any model's answer can be read).
  required   a JSON array of calls [{"name": N, "parameters": {...}}, ...] (the grammar of
             every template's `required`, frontend/openai/tool_calls.py).
  named      the JSON arguments of the one tool named.
Earlier turns are rewritten to match: an assistant message's tool_calls become its
content in the auto shape, and a tool message becomes a user message that names the tool
whose result it carries.
"""

from __future__ import annotations

import json
from typing import Any

_INTRO = "You can call these tools (each with the JSON schema of its parameters):"
_ANSWER = {
    "auto": 'Answer with one JSON object and nothing else: {"tool_calls": [{"name": '
            '"<tool name>", "arguments": {...}}]} to call tools, or {"response": "<your '
            'answer>"} to answer directly.',
    "required": 'Answer with a JSON array of tool calls and nothing else: [{"name": '
                '"<tool name>", "parameters": {...}}].',
    "named": "Answer with the JSON arguments of the tool {} and nothing else.",
}


def renders_tools(tokenizer: Any) -> bool:
    """Whether the chat template reads its `tools` variable (else it would drop them)."""
    return "tools" in str(getattr(tokenizer, "chat_template", "") or "")


def auto_schema(tools: list[dict[str, Any]], parallel: bool) -> dict[str, Any]:
    """The grammar of a generic `auto` answer: words or calls, each call of a declared tool
    with arguments its schema allows."""
    calls = [{"type": "object", "properties": {
        "name": {"const": t["function"]["name"]}, "arguments": t["function"]["parameters"]},
        "required": ["name", "arguments"], "additionalProperties": False} for t in tools]
    array: dict[str, Any] = {"type": "array", "minItems": 1,
                             "items": calls[0] if len(calls) == 1 else {"anyOf": calls}}
    if not parallel:
        array["maxItems"] = 1
    return {"anyOf": [
        {"type": "object", "properties": {"response": {"type": "string"}},
         "required": ["response"], "additionalProperties": False},
        {"type": "object", "properties": {"tool_calls": array},
         "required": ["tool_calls"], "additionalProperties": False}]}


def parse_auto(text: str) -> tuple[str | None, list[tuple[str, str]]]:
    """(content, calls) of a generic `auto` answer; text that is not the format (cut short
    by max_tokens) stays content."""
    try:
        value = json.loads(text)
    except ValueError:
        return text, []
    if isinstance(value, dict) and isinstance(value.get("response"), str):
        return value["response"], []
    calls = value.get("tool_calls") if isinstance(value, dict) else None
    if not isinstance(calls, list) or not calls:
        return text, []
    return None, [(call["name"], json.dumps(call["arguments"], ensure_ascii=False))
                  for call in calls]


def system_text(tools: list[dict[str, Any]], mode: str, named: str | None) -> str:
    listed = [{"name": t["function"]["name"],
               "description": t["function"].get("description") or "",
               "parameters": t["function"]["parameters"]} for t in tools]
    lines = [_INTRO, *(json.dumps(tool, ensure_ascii=False) for tool in listed),
             _ANSWER[mode].replace("{}", named or "")]
    return "\n".join(lines)


def with_tools(messages: list[dict[str, Any]], tools: list[dict[str, Any]], mode: str,
               named: str | None) -> list[dict[str, Any]]:
    """`messages` as a template without tools can render them: the tools in the system
    message (added, or appended to the first one), calls and results as text."""
    text = system_text(tools, mode, named)
    names = {}
    rewritten = []
    for message in messages:
        message = dict(message)
        calls = message.pop("tool_calls", None)
        if calls:
            names.update((call.get("id"), call["function"]["name"]) for call in calls)
            message["content"] = json.dumps({"tool_calls": [
                {"name": call["function"]["name"], "arguments": call["function"]["arguments"]}
                for call in calls]}, ensure_ascii=False)
        if message["role"] == "tool":
            name = message.pop("name", None) or names.get(message.get("tool_call_id"), "a tool")
            message = {"role": "user", "content": f"Result of {name}: {message['content']}"}
        message.pop("tool_call_id", None)
        message.pop("name", None)
        rewritten.append(message)
    if rewritten and rewritten[0]["role"] == "system":
        first = rewritten[0]
        return [{**first, "content": f"{first['content']}\n\n{text}"}, *rewritten[1:]]
    return [{"role": "system", "content": text}, *rewritten]
