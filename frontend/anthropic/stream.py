"""A streamed chat completion as Anthropic's event stream: message_start (with the prompt's
input_tokens), a ping, then per content block content_block_start, its deltas (thinking_delta
then one signature_delta for a thinking block, first; text_delta; input_json_delta for a
tool_use block's arguments) and content_block_stop; message_delta
with stop_reason, stop_sequence and usage; message_stop. A refusal mid-stream is an
`error` event, and the stream ends."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from typing import Any

from folio.frontend.anthropic.answer import (message, new_message_id, stop_reason,
                                             thinking_block, tool_use_id, usage_of)
from folio.frontend.anthropic.errors import from_openai


def _event(kind: str, data: dict[str, Any]) -> str:
    return f"event: {kind}\ndata: {json.dumps({'type': kind, **data}, ensure_ascii=False)}\n\n"


async def message_events(model: str, prompt_tokens: int,
                         chunks: AsyncIterator[dict[str, Any]],
                         stop_sequences: tuple[str, ...]) -> AsyncIterator[str]:
    start = message(new_message_id(), model, [], None, usage_of(prompt_tokens, 0))
    yield _event("message_start", {"message": start})
    yield _event("ping", {})
    block: int | None = None           # the open block's index
    thinking: int | None = None        # the open thinking block's index
    blocks = 0
    calls: dict[int, int] = {}         # chat tool call index -> block index
    finish = chat_stop = None
    output_tokens = 0
    async for chunk in chunks:
        if "error" in chunk:
            error = from_openai(chunk["error"])
            yield _event("error", {"error": error["error"]})
            return
        if chunk.get("usage") is not None:
            output_tokens = chunk["usage"]["completion_tokens"]
        for choice in chunk["choices"]:
            delta = choice["delta"]
            if delta.get("reasoning_content"):
                if thinking is None:
                    thinking, blocks = blocks, blocks + 1
                    yield _event("content_block_start", {
                        "index": thinking, "content_block": thinking_block("")})
                yield _event("content_block_delta", {"index": thinking, "delta": {
                    "type": "thinking_delta", "thinking": delta["reasoning_content"]}})
            if thinking is not None and (delta.get("content") or delta.get("tool_calls")):
                for line in _end_thinking(thinking):   # the answer begins
                    yield line
                thinking = None
            if delta.get("content"):
                if block is None:
                    block, blocks = blocks, blocks + 1
                    yield _event("content_block_start", {
                        "index": block, "content_block": {"type": "text", "text": ""}})
                yield _event("content_block_delta", {"index": block, "delta": {
                    "type": "text_delta", "text": delta["content"]}})
            for part in delta.get("tool_calls") or []:
                if part["index"] not in calls:
                    if block is not None:
                        yield _event("content_block_stop", {"index": block})
                    block = calls[part["index"]] = blocks
                    blocks += 1
                    yield _event("content_block_start", {"index": block, "content_block": {
                        "type": "tool_use", "id": tool_use_id(part["id"]),
                        "name": part["function"]["name"], "input": {}}})
                arguments = part["function"].get("arguments")
                if arguments:
                    yield _event("content_block_delta", {
                        "index": calls[part["index"]],
                        "delta": {"type": "input_json_delta", "partial_json": arguments}})
            if choice.get("finish_reason") is not None:
                finish, chat_stop = choice["finish_reason"], choice.get("stop_reason")
    if thinking is not None:
        for line in _end_thinking(thinking):
            yield line
    if block is None and not calls:   # an empty answer still has its one text block
        block = blocks
        yield _event("content_block_start", {"index": block,
                                             "content_block": {"type": "text", "text": ""}})
    if block is not None:
        yield _event("content_block_stop", {"index": block})
    reason, sequence = stop_reason(finish, chat_stop, bool(calls), stop_sequences)
    yield _event("message_delta", {"delta": {"stop_reason": reason, "stop_sequence": sequence},
                                   "usage": {"output_tokens": output_tokens}})
    yield _event("message_stop", {})


def _end_thinking(index: int) -> list[str]:
    """A thinking block ends with its signature (Folio's is empty), then its stop."""
    return [_event("content_block_delta", {"index": index, "delta": {
                "type": "signature_delta", "signature": ""}}),
            _event("content_block_stop", {"index": index})]
