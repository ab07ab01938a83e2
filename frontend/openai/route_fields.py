"""Which request fields each OpenAI route honours; anything else is refused by name.

A field a client sends is either honoured or answered with a 400 naming it (`param`), as
OpenAI does for unknown parameters: a caller asking for tools or JSON mode must never get
free text back as if it had been understood.
"""

from __future__ import annotations

from typing import Any

from folio.frontend.openai.errors import ApiError

# Sampling fields both routes honour (OpenAI's, then the vLLM extras Folio implements).
_SAMPLING = frozenset({
    "model", "stream", "stream_options", "n", "temperature", "top_p", "seed", "stop",
    "presence_penalty", "frequency_penalty", "logit_bias", "max_tokens",
    "top_k", "min_p", "repetition_penalty", "ignore_eos", "min_tokens", "skip_special_tokens",
    "include_stop_str_in_output", "stop_token_ids", "response_format",
    # Structured outputs (frontend/openai/structured_output.py): vLLM's current and older names.
    "structured_outputs", "guided_json", "guided_regex", "guided_choice", "guided_grammar",
    "guided_decoding_backend", "guided_whitespace_pattern",
    "deadline",          # Folio's own: seconds before the server aborts the request
    "priority",          # vLLM's: lower first, under --scheduling-policy priority
})
# Honoured by definition: they only label the request for the caller's own bookkeeping,
# or ask for what Folio does anyway.
_LABELS = frozenset({"user", "safety_identifier", "prompt_cache_key", "metadata"})

COMPLETION_FIELDS = _SAMPLING | _LABELS | {"prompt", "echo", "logprobs", "best_of"}
CHAT_FIELDS = _SAMPLING | _LABELS | {
    "messages", "logprobs", "top_logprobs", "max_completion_tokens", "store", "service_tier",
    "modalities",
    # Tool calling (frontend/openai/tool_calls.py); the deprecated two are refused there by name.
    "tools", "tool_choice", "parallel_tool_calls", "functions", "function_call",
    # Reasoning (frontend/reasoning/request_fields.py).
    "reasoning_effort", "chat_template_kwargs"}
TOKENIZE_FIELDS = frozenset({"model", "prompt", "messages", "add_special_tokens",
                             "add_generation_prompt", "return_token_strs"})
DETOKENIZE_FIELDS = frozenset({"model", "tokens"})

# Accepted only with the value that asks for nothing beyond plain behaviour.
_PLAIN_VALUES = {"best_of": (None, 1), "store": (None, False),
                 "service_tier": (None, "auto", "default"),
                 "modalities": (None, ["text"])}


def _refuse(field: str, message: str, code: str) -> ApiError:
    return ApiError(400, message, field, code)


def check_fields(body: dict[str, Any], accepted: frozenset[str], route: str) -> None:
    """400 for the first field `route` does not honour, naming it in `param`."""
    for field, value in body.items():
        if field not in accepted:
            raise _refuse(field, f"Unrecognized request argument supplied: {field} "
                          f"({route} does not honour it)", "unknown_parameter")
        if field in _PLAIN_VALUES and not any(
                type(value) is type(plain) and value == plain
                for plain in _PLAIN_VALUES[field]):   # type too: true is not 1
            allowed = " or ".join(repr(v) for v in _PLAIN_VALUES[field] if v is not None)
            raise _refuse(field, f"{field}={value!r} is not supported; only {allowed}",
                          "unsupported_value")
        elif field in _LABELS and value is not None and not _label_ok(field, value):
            raise _refuse(field, f"{field} must be a string" + (
                " map" if field == "metadata" else ""), "invalid_value")


def _label_ok(field: str, value: Any) -> bool:
    if field == "metadata":
        return isinstance(value, dict) and all(
            isinstance(k, str) and isinstance(v, str) for k, v in value.items())
    return isinstance(value, str)
