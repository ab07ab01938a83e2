"""The fields of OpenAI request bodies, each parsed and checked: the sampling parameters, the
prompts, the chat messages, the stream options; and the names the model is served under.
frontend/openai/requests.py puts them together into one typed request per route."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from folio.default_model import default_model_path
from folio.frontend.openai.errors import invalid
from folio.frontend.openai.tool_calls import message_tool_calls
from folio.shared.sampling_params import SamplingParams

MAX_PROMPTS = 64   # n is bounded by the scheduler's --max-n (engine_info), not here

# OpenAI names -> SamplingParams fields, plus the vLLM extras people send.
_PASS_THROUGH = ("temperature", "top_p", "n", "seed", "presence_penalty", "frequency_penalty",
                 "top_k", "min_p", "repetition_penalty", "ignore_eos", "min_tokens",
                 "skip_special_tokens", "include_stop_str_in_output", "stop_token_ids",
                 "priority")
DEFAULT_MODEL_NAME = "folio-default"   # the built-in model's name (folio/default_model)


def served_names(given: str | list[str] | None, model: str) -> list[str]:
    """--served-model-name's names (one string, from FOLIO_SERVED_MODEL_NAME, holds
    several separated by spaces), else DEFAULT_MODEL_NAME for the built-in model, else the
    checkpoint directory's own name and, as vLLM serves it, the path exactly as given
    (clients written for `vllm serve PATH` send `model=PATH`)."""
    names = given.split() if isinstance(given, str) else list(given or [])
    if names:
        return names
    if _is_default_model(model):
        return [DEFAULT_MODEL_NAME]
    name = Path(model.rstrip("/\\")).name or model
    return [name] if model == name else [name, model]


def _is_default_model(model: str) -> bool:
    try:
        return Path(model).resolve() == default_model_path().resolve()
    except FileNotFoundError:   # not shipped here: no model can be it
        return False


@dataclass(frozen=True)
class StreamOptions:
    stream: bool
    include_usage: bool


def stream_options(body: dict[str, Any]) -> StreamOptions:
    stream = body.get("stream") or False
    if not isinstance(stream, bool):
        raise invalid("stream must be a boolean", "stream")
    options = body.get("stream_options") or {}
    if not isinstance(options, dict):
        raise invalid("stream_options must be an object", "stream_options")
    if options and not stream:
        raise invalid("stream_options is only allowed when stream is true", "stream_options")
    include = options.get("include_usage", False)
    if not isinstance(include, bool):
        raise invalid("stream_options.include_usage must be a boolean", "stream_options")
    return StreamOptions(stream, include)


def sampling_params(body: dict[str, Any], max_tokens_key: str, logprobs: int | None
                    ) -> SamplingParams:
    """Build SamplingParams; every ValueError/TypeError becomes a 400 naming the parameter."""
    fields: dict[str, Any] = {k: body[k] for k in _PASS_THROUGH if body.get(k) is not None}
    max_tokens = body.get(max_tokens_key)
    if max_tokens is None and max_tokens_key != "max_tokens":
        max_tokens = body.get("max_tokens")
    if max_tokens is not None:
        fields["max_tokens"] = max_tokens
    elif max_tokens_key == "max_tokens":
        fields["max_tokens"] = 16            # the completions API's default
    else:
        fields["max_tokens"] = None          # chat: up to the context limit
    stop = body.get("stop")
    if stop is not None:
        if isinstance(stop, str):
            stop = [stop]
        if not isinstance(stop, list) or not all(isinstance(s, str) for s in stop):
            raise invalid("stop must be a string or a list of strings", "stop")
        fields["stop"] = stop
    bias = body.get("logit_bias")
    if bias is not None:
        if not isinstance(bias, dict):
            raise invalid("logit_bias must map token ids to biases", "logit_bias")
        fields["logit_bias"] = bias
    if logprobs is not None:
        fields["logprobs"] = logprobs
    try:
        return SamplingParams(**fields)
    except (TypeError, ValueError) as error:
        message = str(error)
        param = message.split(" ", 1)[0] if message else None
        raise invalid(message, param if param in SamplingParams.__dataclass_fields__ else None)


def completion_prompts(prompt: Any) -> list[str | list[int]]:
    """A string, a list of strings, a list of token ids, or a list of token-id lists."""
    if isinstance(prompt, str):
        return [prompt]
    if isinstance(prompt, list) and prompt:
        if all(isinstance(p, str) for p in prompt):
            prompts: list[str | list[int]] = list(prompt)
        elif all(isinstance(t, int) and not isinstance(t, bool) for t in prompt):
            prompts = [list(prompt)]
        elif all(isinstance(p, list) and p and all(
                isinstance(t, int) and not isinstance(t, bool) for t in p) for p in prompt):
            prompts = [list(p) for p in prompt]
        else:
            raise invalid("prompt must be a string, a list of strings, a list of token ids "
                          "or a list of token-id lists", "prompt")
        if len(prompts) > MAX_PROMPTS:
            raise invalid(f"at most {MAX_PROMPTS} prompts per request", "prompt")
        return prompts
    raise invalid("prompt must be a non-empty string or list", "prompt")


def chat_messages(messages: Any) -> list[dict[str, Any]]:
    """Messages with string content or text parts; roles are passed to the chat template.
    An assistant message's tool_calls and a tool message's tool_call_id (and name) are
    kept for templates that render them."""
    if not isinstance(messages, list) or not messages:
        raise invalid("messages must be a non-empty list", "messages")
    result = []
    for message in messages:
        if not isinstance(message, dict):
            raise invalid("each message must be an object", "messages")
        role = message.get("role")
        if not isinstance(role, str) or not role or len(role) > 64:
            raise invalid("each message needs a role (a short string)", "messages")
        content = message.get("content")
        if content is None:
            content = ""
        if isinstance(content, list):
            parts = []
            for part in content:
                kind = part.get("type") if isinstance(part, dict) else None
                if kind != "text" or not isinstance(part.get("text"), str):
                    # Multimodal checkpoints (Gemma 4) are served as their text model.
                    named = f", not {kind!r}" if isinstance(kind, str) and kind != "text" else ""
                    raise invalid(f"only text content parts are supported{named}", "messages")
                parts.append(part["text"])
            content = "".join(parts)
        if not isinstance(content, str):
            raise invalid("message content must be a string or a list of text parts",
                          "messages")
        entry: dict[str, Any] = {"role": role, "content": content}
        if message.get("tool_calls") is not None:
            if role != "assistant":
                raise invalid("messages: only assistant messages carry tool_calls",
                              "messages")
            entry["tool_calls"] = message_tool_calls(message["tool_calls"])
        reasoning = message.get("reasoning_content")
        if reasoning is not None:   # an earlier turn's reasoning (frontend/reasoning/history.py)
            if role != "assistant" or not isinstance(reasoning, str):
                raise invalid("messages: reasoning_content is an assistant message's string",
                              "messages")
            entry["reasoning_content"] = reasoning
        for key in ("tool_call_id", "name"):
            if message.get(key) is not None:
                if not isinstance(message[key], str) or len(message[key]) > 256:
                    raise invalid(f"messages: {key} must be a short string", "messages")
                entry[key] = message[key]
        result.append(entry)
    return result
