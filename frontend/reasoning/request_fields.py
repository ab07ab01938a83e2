"""The chat body's reasoning fields, as the chat template's variables:

  reasoning_effort       OpenAI's: "none" -> enable_thinking false (Qwen3-style templates);
                         "low" | "medium" | "high" -> reasoning_effort (gpt-oss's template
                         reads it) and enable_thinking true. Needs --reasoning-parser.
  chat_template_kwargs   vLLM's: only enable_thinking (a boolean) and reasoning_effort
                         (low, medium, high); any other variable is refused by name (a
                         client must not reach `messages` or `tools` through it).

A template that reads neither variable renders as it would without them. A grammar-held
answer (response_format, tool_choice required or named) leaves no room to reason: Folio's
grammars cover every generated token, so such a request renders with enable_thinking false
and asking for reasoning with it is refused.
"""

from __future__ import annotations

from typing import Any

from folio.frontend.openai.errors import invalid

EFFORTS = ("low", "medium", "high")
_KWARGS = {"enable_thinking", "reasoning_effort"}


def template_kwargs(body: dict[str, Any], parser: str | None,
                    grammar: str | None) -> dict[str, Any]:
    """`grammar`: the field that holds the answer to a grammar, or None."""
    kwargs = _chat_template_kwargs(body.get("chat_template_kwargs"))
    effort = body.get("reasoning_effort")
    if effort is not None:
        if parser is None:
            raise invalid("reasoning_effort needs the server started with "
                          "--reasoning-parser: this server does not read reasoning",
                          "reasoning_effort")
        if effort == "none":
            if parser == "gpt_oss":
                raise invalid("reasoning_effort 'none': gpt-oss always reasons; send low, "
                              "medium or high", "reasoning_effort")
            kwargs["enable_thinking"] = False
        elif effort in EFFORTS:
            kwargs.update(reasoning_effort=effort, enable_thinking=True)
        else:
            raise invalid(f"reasoning_effort must be one of none, {', '.join(EFFORTS)}",
                          "reasoning_effort")
    if grammar is not None:
        if kwargs.get("enable_thinking") or "reasoning_effort" in kwargs:
            field = "reasoning_effort" if effort is not None else "chat_template_kwargs"
            raise invalid(f"{field}: {grammar} holds the whole answer to a grammar, which "
                          "leaves no room to reason first; send one or the other", field)
        if parser is not None:
            kwargs["enable_thinking"] = False
    return kwargs


def _chat_template_kwargs(value: Any) -> dict[str, Any]:
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise invalid("chat_template_kwargs must be an object", "chat_template_kwargs")
    unknown = sorted(set(value) - _KWARGS)
    if unknown:
        raise invalid(f"chat_template_kwargs.{unknown[0]} is not supported (only "
                      f"{', '.join(sorted(_KWARGS))})", "chat_template_kwargs")
    kwargs = dict(value)
    if not isinstance(kwargs.get("enable_thinking", True), bool):
        raise invalid("chat_template_kwargs.enable_thinking must be a boolean",
                      "chat_template_kwargs")
    if kwargs.get("reasoning_effort", "low") not in EFFORTS:
        raise invalid(f"chat_template_kwargs.reasoning_effort must be one of "
                      f"{', '.join(EFFORTS)}", "chat_template_kwargs")
    return kwargs
