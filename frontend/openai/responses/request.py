"""A POST /v1/responses body, checked, as the chat body it runs as (frontend/chat_bridge.py)
and the request fields its Response object echoes back.

Every field is honoured or refused by name, as on the chat route (frontend/openai/
route_fields.py): a client asking for hosted tools, reasoning summaries or background runs
never gets plain text back as if it had been understood. `reasoning.effort` runs as the
chat body's reasoning_effort (frontend/reasoning/request_fields.py): it needs
--reasoning-parser; "none" turns a Qwen3-style template's thinking off, low/medium/high go
to the template (gpt-oss reads them).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from folio.frontend.openai.errors import ApiError, invalid
from folio.frontend.openai.responses.input_items import input_messages

# Sampling fields passed to the chat path as they are (OpenAI's, then the vLLM extras the
# chat route honours too).
_SAMPLING = ("temperature", "top_p", "seed", "stop", "presence_penalty", "frequency_penalty",
             "top_k", "min_p", "repetition_penalty", "ignore_eos", "min_tokens",
             "stop_token_ids", "deadline", "priority", "parallel_tool_calls")
# Labels for the caller's bookkeeping, echoed back, asking nothing of the model.
_LABELS = ("user", "safety_identifier", "prompt_cache_key")
RESPONSES_FIELDS = frozenset({
    "model", "input", "instructions", "max_output_tokens", "tools", "tool_choice", "text",
    "stream", "store", "previous_response_id", "metadata", "include", "top_logprobs",
    "truncation", "service_tier", "reasoning", *_SAMPLING, *_LABELS})
# Accepted only with the value that asks for nothing beyond plain behaviour.
_PLAIN_VALUES = {"truncation": (None, "disabled"), "service_tier": (None, "auto", "default")}
REASONING_EFFORTS = ("none", "low", "medium", "high")
LOGPROBS_INCLUDE = "message.output_text.logprobs"
# Chat field names in the chat path's refusals -> this API's.
RENAMES = {"messages": "input", "max_completion_tokens": "max_output_tokens",
           "max_tokens": "max_output_tokens", "response_format": "text.format",
           "logprobs": "include", "stream_options": "stream",
           "reasoning_effort": "reasoning.effort"}


@dataclass(frozen=True)
class ResponsesRequest:
    chat: dict[str, Any]            # the chat body, but for `messages`
    instructions: str | None
    input: list[dict[str, Any]]     # the new turn, as chat messages
    previous_response_id: str | None
    store: bool
    stream: bool
    echo: dict[str, Any]            # the request fields a Response object carries

    def chat_body(self, history: list[dict[str, Any]]) -> dict[str, Any]:
        """After `history` (the conversation previous_response_id carries on)."""
        system = [] if self.instructions is None else [
            {"role": "system", "content": self.instructions}]
        return {**self.chat, "messages": system + history + self.input}

    @classmethod
    def parse(cls, body: dict[str, Any]) -> ResponsesRequest:
        _check_fields(body)
        chat: dict[str, Any] = {key: body[key] for key in _SAMPLING if key in body}
        stream = _bool(body, "stream", False)
        if stream:
            chat.update(stream=True, stream_options={"include_usage": True})
        if body.get("max_output_tokens") is not None:
            chat["max_completion_tokens"] = body["max_output_tokens"]
        tools = _tools(body.get("tools"))
        if tools is not None:
            chat["tools"] = tools
        if body.get("tool_choice") is not None:
            chat["tool_choice"] = _tool_choice(body["tool_choice"])
        text = _text(body.get("text"))
        if text["format"]["type"] != "text":
            chat["response_format"] = _response_format(text["format"])
        _logprobs(body, chat)
        effort = _reasoning(body.get("reasoning"))
        if effort is not None:
            chat["reasoning_effort"] = effort
        instructions = body.get("instructions")
        if instructions is not None and not isinstance(instructions, str):
            raise invalid("instructions must be a string", "instructions")
        previous = body.get("previous_response_id")
        if previous is not None and (not isinstance(previous, str) or not previous):
            raise invalid("previous_response_id must be a response id", "previous_response_id")
        metadata = _metadata(body.get("metadata"))
        echo = {
            "instructions": instructions, "max_output_tokens": body.get("max_output_tokens"),
            "metadata": metadata, "parallel_tool_calls": body.get("parallel_tool_calls", True),
            "previous_response_id": previous, "store": _bool(body, "store", True),
            "temperature": body.get("temperature", 1.0), "top_p": body.get("top_p", 1.0),
            "text": text, "tool_choice": body.get("tool_choice") or "auto",
            "tools": body.get("tools") or [], "top_logprobs": body.get("top_logprobs"),
            "truncation": "disabled", "reasoning": {"effort": effort, "summary": None},
            "service_tier": body.get("service_tier") or "default",
            **{label: body.get(label) for label in _LABELS}}
        return cls(chat, instructions, input_messages(body.get("input")), previous,
                   echo["store"], stream, echo)


def _check_fields(body: dict[str, Any]) -> None:
    for field, value in body.items():
        if field not in RESPONSES_FIELDS:
            raise ApiError(400, f"Unrecognized request argument supplied: {field} "
                           "(/v1/responses does not honour it)", field, "unknown_parameter")
        plain = _PLAIN_VALUES.get(field)
        if plain is not None and value not in plain:
            raise ApiError(400, f"{field}={value!r} is not supported; only "
                           f"{' or '.join(repr(v) for v in plain if v is not None)}", field,
                           "unsupported_value")
    for label in _LABELS:
        if body.get(label) is not None and not isinstance(body[label], str):
            raise invalid(f"{label} must be a string", label)


def _bool(body: dict[str, Any], field: str, default: bool) -> bool:
    value = body.get(field)
    if value is None:
        return default
    if not isinstance(value, bool):
        raise invalid(f"{field} must be a boolean", field)
    return value


def _metadata(value: Any) -> dict[str, str]:
    if value is None:
        return {}
    if not isinstance(value, dict) or not all(
            isinstance(k, str) and isinstance(v, str) for k, v in value.items()):
        raise invalid("metadata must be a map of strings to strings", "metadata")
    return value


def _reasoning(value: Any) -> str | None:
    """reasoning {effort, summary}: the effort, or None; summaries are refused (the
    reasoning text itself is what the output's reasoning items carry)."""
    if value is None:
        return None
    if not isinstance(value, dict):
        raise invalid("reasoning must be an object ({\"effort\": ...})", "reasoning")
    unknown = sorted(set(value) - {"effort", "summary"})
    if unknown:
        raise ApiError(400, f"reasoning.{unknown[0]} is not supported (only "
                       "reasoning.effort)", f"reasoning.{unknown[0]}", "unknown_parameter")
    if value.get("summary") is not None:
        raise ApiError(400, "reasoning.summary is not supported: reasoning items carry the "
                       "reasoning text itself (content reasoning_text), no summary",
                       "reasoning.summary", "unsupported_value")
    effort = value.get("effort")
    if effort is not None and effort not in REASONING_EFFORTS:
        raise ApiError(400, f"reasoning.effort {effort!r} is not supported; one of "
                       f"{', '.join(REASONING_EFFORTS)}", "reasoning.effort",
                       "unsupported_value")
    return effort


def _tools(value: Any) -> list[dict[str, Any]] | None:
    """Function tools in the chat shape; hosted tools are refused by their type."""
    if value is None:
        return None
    if not isinstance(value, list):
        raise invalid("tools must be a list of function tools", "tools")
    tools = []
    for tool in value:
        kind = tool.get("type") if isinstance(tool, dict) else None
        if kind != "function":
            raise ApiError(400, f"tools: tool type {kind!r} is not supported; only "
                           "'function' tools", "tools", "unsupported_value")
        # `strict` asks for arguments that match the schema: a required or named call is
        # held to it by the grammar; an `auto` call is read as the model wrote it.
        function = {key: tool[key] for key in ("name", "description", "parameters")
                    if tool.get(key) is not None}
        tools.append({"type": "function", "function": function})
    return tools


def _tool_choice(value: Any) -> Any:
    if value in ("none", "auto", "required"):
        return value
    if isinstance(value, dict) and value.get("type") == "function":
        if not isinstance(value.get("name"), str):
            raise invalid("tool_choice.name must be a string (a function in tools)",
                          "tool_choice")
        return {"type": "function", "function": {"name": value["name"]}}
    kind = value.get("type") if isinstance(value, dict) else value
    raise ApiError(400, f"tool_choice {kind!r} is not supported; use \"none\", \"auto\", "
                   "\"required\" or {\"type\": \"function\", \"name\": ...}", "tool_choice",
                   "unsupported_value")


def _text(value: Any) -> dict[str, Any]:
    if value is None:
        return {"format": {"type": "text"}}
    if not isinstance(value, dict):
        raise invalid("text must be an object", "text")
    unknown = sorted(set(value) - {"format"})
    if unknown:
        raise ApiError(400, f"text.{unknown[0]} is not supported (only text.format)",
                       f"text.{unknown[0]}", "unknown_parameter")
    format_ = value.get("format") or {"type": "text"}
    if not isinstance(format_, dict) or format_.get("type") not in (
            "text", "json_schema", "json_object"):
        raise invalid("text.format must be {\"type\": \"text\"}, {\"type\": \"json_object\"}"
                      " or {\"type\": \"json_schema\", \"name\", \"schema\"}", "text.format")
    return {"format": format_}


def _response_format(format_: dict[str, Any]) -> dict[str, Any]:
    """text.format as the chat route's response_format (its json_schema one level down)."""
    if format_["type"] == "json_object":
        return {"type": "json_object"}
    schema = {key: format_[key] for key in ("name", "schema", "strict", "description")
              if key in format_}
    return {"type": "json_schema", "json_schema": schema}


def _logprobs(body: dict[str, Any], chat: dict[str, Any]) -> None:
    """include ["message.output_text.logprobs"] (with top_logprobs) asks for them."""
    include = body.get("include")
    if include is None:
        include = []
    if not isinstance(include, list) or not all(isinstance(i, str) for i in include):
        raise invalid("include must be a list of strings", "include")
    unknown = [i for i in include if i != LOGPROBS_INCLUDE]
    if unknown:
        raise ApiError(400, f"include {unknown[0]!r} is not supported; only "
                       f"{LOGPROBS_INCLUDE!r}", "include", "unsupported_value")
    top = body.get("top_logprobs")
    if include:
        chat["logprobs"] = True
        if top is not None:
            chat["top_logprobs"] = top
    elif top is not None:
        chat.update(logprobs=True, top_logprobs=top)
