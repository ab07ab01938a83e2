"""Reasoning of earlier assistant turns (chat's reasoning_content, Responses' reasoning
items, Anthropic's thinking blocks), handed to the chat template. The template decides
what to render: Qwen3's keeps only the reasoning after the last user turn, gpt-oss's the
analysis of a turn that called tools (it reads `thinking`). A server without a reasoning
parser drops it, as OpenAI drops reasoning items sent to a model that does not reason."""

from __future__ import annotations

from typing import Any

KEY = "reasoning_content"   # vLLM's name, in the chat messages the frontend passes around


def for_template(messages: list[dict[str, Any]], parser: str | None
                 ) -> list[dict[str, Any]]:
    if not any(KEY in message for message in messages):
        return messages
    result = []
    for message in messages:
        if KEY in message:
            message = dict(message)
            reasoning = message.pop(KEY)
            if parser is not None:
                message[KEY] = reasoning
                if parser == "gpt_oss":
                    message["thinking"] = reasoning
        result.append(message)
    return result
