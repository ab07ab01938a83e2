"""A POST /v1/messages (or /v1/messages/count_tokens) body, checked, as the chat body it
runs as (frontend/chat_bridge.py).

  system            a string or text blocks -> the first, system, message
  messages          user/assistant turns; content a string or blocks: text, tool_use
                    (assistant), tool_result (user; its results become tool messages)
  tools             {name, description, input_schema} -> function tools
  tool_choice       auto | any (-> required) | tool {name} (-> named) | none;
                    disable_parallel_tool_use -> parallel_tool_calls false
  stop_sequences    -> stop;  max_tokens (required) -> max_tokens
  output_config     {"format": {"type": "json_schema", "schema"}} -> response_format
  thinking          {"type": "enabled", "budget_tokens": N} (needs --reasoning-parser;
                    N >= 1024 and < max_tokens, as Anthropic checks it; accepted, not a cap
                    of its own: max_tokens bounds thinking and answer together) -> the
                    template's enable_thinking true; {"type": "disabled"} -> false; absent:
                    the template's default. Thinking blocks of earlier assistant turns go
                    to the template as reasoning_content (frontend/reasoning/history.py).
Current `anthropic` SDKs no longer offer temperature, top_p or top_k as arguments; they
are honoured when sent (extra_body, older clients), else the chat path's defaults hold.
Every other field is honoured or refused by name; `cache_control` marks are accepted and
need nothing (the prefix cache reuses any shared prefix by itself).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from folio.frontend.openai.errors import ApiError, invalid

_SAMPLING = ("temperature", "top_p", "top_k",
             # Folio's (and vLLM's) extras, as the chat route honours them
             "seed", "min_p", "repetition_penalty", "ignore_eos", "deadline", "priority")
_COMMON = frozenset({"model", "messages", "system", "tools", "tool_choice", "thinking",
                     "output_config", "cache_control"})
MESSAGES_FIELDS = _COMMON | {"max_tokens", "stop_sequences", "stream", "metadata",
                             "service_tier", *_SAMPLING}
COUNT_FIELDS = _COMMON
_PLAIN_VALUES = {"service_tier": (None, "auto", "standard_only")}
MIN_THINKING_BUDGET = 1024   # Anthropic's own minimum for budget_tokens
# Chat field names in the chat path's refusals -> this API's.
RENAMES = {"stop": "stop_sequences", "max_completion_tokens": "max_tokens",
           "response_format": "output_config.format", "chat_template_kwargs": "thinking"}


@dataclass(frozen=True)
class MessagesRequest:
    chat: dict[str, Any]
    stop_sequences: tuple[str, ...]
    stream: bool

    @classmethod
    def parse(cls, body: dict[str, Any], count_only: bool = False,
              reasoning_parser: str | None = None) -> MessagesRequest:
        """`reasoning_parser`: the server's --reasoning-parser (thinking needs one)."""
        _check_fields(body, COUNT_FIELDS if count_only else MESSAGES_FIELDS,
                      "/v1/messages/count_tokens" if count_only else "/v1/messages")
        chat: dict[str, Any] = {key: body[key] for key in _SAMPLING if key in body}
        chat["messages"] = _system(body.get("system")) + _messages(body.get("messages"))
        if body.get("tools") is not None:
            chat["tools"] = _tools(body["tools"])
        if body.get("tool_choice") is not None:
            chat.update(_tool_choice(body["tool_choice"]))
        response_format = _output_format(body.get("output_config"))
        if response_format is not None:
            chat["response_format"] = response_format
        budget = _thinking(body.get("thinking"), reasoning_parser, chat)
        if count_only:
            return cls(chat, (), False)
        max_tokens = body.get("max_tokens")
        if isinstance(max_tokens, bool) or not isinstance(max_tokens, int) or max_tokens < 1:
            raise invalid("max_tokens: a positive integer is required", "max_tokens")
        if budget is not None and budget >= max_tokens:
            raise invalid(f"thinking.budget_tokens ({budget}) must be less than max_tokens "
                          f"({max_tokens})", "thinking")
        chat["max_tokens"] = max_tokens
        stops = body.get("stop_sequences")
        if stops is not None:
            if not isinstance(stops, list) or not all(isinstance(s, str) and s for s in stops):
                raise invalid("stop_sequences must be a list of non-empty strings",
                              "stop_sequences")
            chat["stop"] = stops
        metadata = body.get("metadata")
        if metadata is not None and not (isinstance(metadata, dict) and set(metadata) <= {
                "user_id"} and isinstance(metadata.get("user_id", ""), (str, type(None)))):
            raise invalid("metadata may hold only user_id (a string)", "metadata")
        stream = body.get("stream", False)
        if not isinstance(stream, bool):
            raise invalid("stream must be a boolean", "stream")
        if stream:
            chat.update(stream=True, stream_options={"include_usage": True})
        return cls(chat, tuple(stops or ()), stream)


def _thinking(value: Any, parser: str | None, chat: dict[str, Any]) -> int | None:
    """thinking as the template's enable_thinking (in `chat`); the budget, if enabled."""
    if value is None:
        return None
    kind = value.get("type") if isinstance(value, dict) else None
    if kind == "disabled" and set(value) == {"type"}:
        if parser is not None:
            chat["chat_template_kwargs"] = {"enable_thinking": False}
        return None
    if kind != "enabled":
        raise invalid(f"thinking: type {kind!r} is not supported; {{\"type\": \"enabled\", "
                      "\"budget_tokens\": N}} or {\"type\": \"disabled\"}", "thinking")
    if parser is None:
        raise invalid("thinking: this server does not separate reasoning (start it with "
                      "--reasoning-parser for a model that reasons)", "thinking")
    unknown = sorted(set(value) - {"type", "budget_tokens"})
    if unknown:
        raise invalid(f"thinking.{unknown[0]} is not supported", "thinking")
    budget = value.get("budget_tokens")
    if isinstance(budget, bool) or not isinstance(budget, int) \
            or budget < MIN_THINKING_BUDGET:
        raise invalid(f"thinking.budget_tokens: an integer >= {MIN_THINKING_BUDGET} is "
                      "required", "thinking")
    chat["chat_template_kwargs"] = {"enable_thinking": True}
    return budget


def _check_fields(body: dict[str, Any], accepted: frozenset[str], route: str) -> None:
    for field, value in body.items():
        if field not in accepted:
            raise ApiError(400, f"{field}: Extra inputs are not permitted ({route} does not "
                           "honour it)", field)
        plain = _PLAIN_VALUES.get(field)
        if plain is not None and value not in plain:
            raise ApiError(400, f"{field}={value!r} is not supported; only "
                           f"{' or '.join(repr(v) for v in plain if v is not None)}", field)


def _text_blocks(value: Any, where: str) -> str:
    """A string, or text blocks joined."""
    if isinstance(value, str):
        return value
    if not isinstance(value, list):
        raise invalid(f"{where} must be a string or a list of text blocks", where)
    parts = []
    for block in value:
        kind = block.get("type") if isinstance(block, dict) else None
        if kind != "text" or not isinstance(block.get("text"), str):
            raise invalid(f"{where}: block type {kind!r} is not supported here (text only)",
                          where)
        parts.append(block["text"])
    return "".join(parts)


def _system(value: Any) -> list[dict[str, Any]]:
    if value is None:
        return []
    return [{"role": "system", "content": _text_blocks(value, "system")}]


def _messages(value: Any) -> list[dict[str, Any]]:
    if not isinstance(value, list) or not value:
        raise invalid("messages must be a non-empty list", "messages")
    result: list[dict[str, Any]] = []
    for i, message in enumerate(value):
        if not isinstance(message, dict) or message.get("role") not in ("user", "assistant"):
            raise invalid(f"messages.{i}: role must be 'user' or 'assistant' (a system prompt "
                          "goes in `system`)", "messages")
        content = message.get("content")
        if isinstance(content, str):
            result.append({"role": message["role"], "content": content})
        elif isinstance(content, list):
            result += _blocks(message["role"], content, f"messages.{i}")
        else:
            raise invalid(f"messages.{i}.content must be a string or a list of blocks",
                          "messages")
    return result


def _blocks(role: str, blocks: list[Any], where: str) -> list[dict[str, Any]]:
    """One turn's blocks as chat messages: an assistant's text and tool calls in one
    message; a user's tool results as tool messages, in order, then its text."""
    text, calls, results, thinking = [], [], [], []
    for j, block in enumerate(blocks):
        kind = block.get("type") if isinstance(block, dict) else None
        at = f"{where}.content.{j}"
        if kind == "text" and isinstance(block.get("text"), str):
            text.append(block["text"])
        elif kind == "thinking" and role == "assistant":
            if not isinstance(block.get("thinking"), str):
                raise invalid(f"{at}: a thinking block needs thinking (a string)", "messages")
            thinking.append(block["thinking"])   # its signature is Folio's "": not checked
        elif kind == "redacted_thinking" and role == "assistant":
            raise invalid(f"{at}: redacted_thinking blocks are Anthropic's encrypted "
                          "reasoning, which no other server can read; drop them", "messages")
        elif kind == "tool_use" and role == "assistant":
            calls.append(_call(block, at))
        elif kind == "tool_result" and role == "user":
            results.append(_result(block, at))
        else:
            raise invalid(f"{at}: block type {kind!r} is not supported in a {role} message "
                          "(text; thinking and tool_use from the assistant; tool_result from "
                          "the user)", "messages")
    if role == "assistant":
        message: dict[str, Any] = {"role": "assistant", "content": "".join(text)}
        if thinking:
            message["reasoning_content"] = "\n\n".join(thinking)
        if calls:
            message["tool_calls"] = calls
        return [message]
    return results + ([{"role": "user", "content": "".join(text)}] if text or not results
                      else [])


def _call(block: dict[str, Any], at: str) -> dict[str, Any]:
    if not isinstance(block.get("id"), str) or not isinstance(block.get("name"), str) \
            or not isinstance(block.get("input"), dict):
        raise invalid(f"{at}: tool_use needs id, name (strings) and input (an object)",
                      "messages")
    return {"id": block["id"], "type": "function",
            "function": {"name": block["name"], "arguments": json.dumps(block["input"])}}


def _result(block: dict[str, Any], at: str) -> dict[str, Any]:
    if not isinstance(block.get("tool_use_id"), str):
        raise invalid(f"{at}: tool_result needs tool_use_id (a string)", "messages")
    content = block.get("content", "")
    text = _text_blocks(content, "messages") if content is not None else ""
    if block.get("is_error"):
        text = f"Error: {text}"   # the chat shape has no flag for it; the model reads it
    return {"role": "tool", "tool_call_id": block["tool_use_id"], "content": text}


def _tools(value: Any) -> list[dict[str, Any]]:
    if not isinstance(value, list):
        raise invalid("tools must be a list", "tools")
    tools = []
    for tool in value:
        if not isinstance(tool, dict):
            raise invalid("tools: each tool must be an object", "tools")
        if tool.get("type", "custom") != "custom":
            raise invalid(f"tools: tool type {tool['type']!r} is not supported; only custom "
                          "tools (name, description, input_schema)", "tools")
        if not isinstance(tool.get("input_schema"), dict):
            raise invalid(f"tools: {tool.get('name')!r} needs input_schema (a JSON schema "
                          "object)", "tools")
        # The chat route's key order: templates print the tool as JSON, order and all.
        function = {"name": tool.get("name")}
        if tool.get("description") is not None:
            function["description"] = tool["description"]
        function["parameters"] = tool["input_schema"]
        tools.append({"type": "function", "function": function})
    return tools


def _tool_choice(value: Any) -> dict[str, Any]:
    kind = value.get("type") if isinstance(value, dict) else None
    chat: dict[str, Any] = {}
    if isinstance(value, dict) and value.get("disable_parallel_tool_use") is not None:
        if not isinstance(value["disable_parallel_tool_use"], bool):
            raise invalid("tool_choice.disable_parallel_tool_use must be a boolean",
                          "tool_choice")
        chat["parallel_tool_calls"] = not value["disable_parallel_tool_use"]
    if kind in ("auto", "none"):
        chat["tool_choice"] = kind
    elif kind == "any":
        chat["tool_choice"] = "required"
    elif kind == "tool" and isinstance(value.get("name"), str):
        chat["tool_choice"] = {"type": "function", "function": {"name": value["name"]}}
    else:
        raise invalid("tool_choice must be {\"type\": \"auto\"}, {\"type\": \"any\"}, "
                      "{\"type\": \"tool\", \"name\": ...} or {\"type\": \"none\"}",
                      "tool_choice")
    return chat


def _output_format(value: Any) -> dict[str, Any] | None:
    """output_config: a JSON schema the answer is held to; `effort` asks for reasoning
    this path does not have, so only its absence is accepted."""
    if value is None:
        return None
    if not isinstance(value, dict) or set(value) - {"format", "effort"} \
            or value.get("effort") is not None:
        raise invalid("output_config: only format is supported (effort is not)",
                      "output_config")
    format_ = value.get("format")
    if format_ is None:
        return None
    if not isinstance(format_, dict) or format_.get("type") != "json_schema" \
            or not isinstance(format_.get("schema"), dict):
        raise invalid("output_config.format must be {\"type\": \"json_schema\", "
                      "\"schema\": {...}}", "output_config")
    return {"type": "json_schema", "json_schema": {"name": "output", "schema":
                                                   format_["schema"]}}
