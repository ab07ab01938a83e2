"""A streamed chat completion as the Responses event stream.

response.created and response.in_progress open it; reasoning (the chat chunks'
reasoning_content) opens a reasoning item first, its reasoning_text part streamed as
response.reasoning_text.delta and closed (reasoning_text.done, content_part.done,
output_item.done) when the answer begins; text opens a message item and its
output_text part (output_item.added, content_part.added), then output_text.delta per
chunk; each tool call is a function_call item with function_call_arguments.delta; every
item is closed (…done events) before response.completed, or response.incomplete when
max_output_tokens cut it short. Every event carries a sequence_number. A refusal
mid-stream (the engine gone, a client too slow) is an `error` event, and the stream ends.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Callable
from typing import Any

from folio.frontend.openai.responses.answer import (ResponseHead, call_item, message_item,
                                                    new_id, reasoning_item, reasoning_part,
                                                    status_of, text_part, usage_of)


class _Events:
    def __init__(self) -> None:
        self.sequence = 0

    def __call__(self, kind: str, **fields: Any) -> str:
        data = {"type": kind, "sequence_number": self.sequence, **fields}
        self.sequence += 1
        return f"event: {kind}\ndata: {json.dumps(data, ensure_ascii=False)}\n\n"


class _Text:
    """The message item text streams into."""

    def __init__(self, index: int) -> None:
        self.index, self.id, self.text, self.logprobs = index, new_id("msg"), "", []

    def open(self, event: _Events) -> list[str]:
        return [event("response.output_item.added", output_index=self.index,
                      item=message_item(self.id, "in_progress", [])),
                event("response.content_part.added", item_id=self.id,
                      output_index=self.index, content_index=0, part=text_part("", None))]

    def delta(self, event: _Events, text: str, logprobs: list | None) -> str:
        self.text += text
        self.logprobs += logprobs or []
        return event("response.output_text.delta", item_id=self.id, output_index=self.index,
                     content_index=0, delta=text, logprobs=logprobs or [])

    def close(self, event: _Events) -> tuple[list[str], dict[str, Any]]:
        part = text_part(self.text, self.logprobs)
        item = message_item(self.id, "completed", [part])
        ids = {"item_id": self.id, "output_index": self.index}
        return [event("response.output_text.done", **ids, content_index=0, text=self.text,
                      logprobs=self.logprobs),
                event("response.content_part.done", **ids, content_index=0, part=part),
                event("response.output_item.done", output_index=self.index, item=item)], item


class _Reasoning:
    """The reasoning item the chat stream's reasoning_content streams into."""

    def __init__(self, index: int) -> None:
        self.index, self.id, self.text = index, new_id("rs"), ""

    def open(self, event: _Events) -> list[str]:
        return [event("response.output_item.added", output_index=self.index,
                      item=reasoning_item(self.id, "in_progress", [])),
                event("response.content_part.added", item_id=self.id,
                      output_index=self.index, content_index=0, part=reasoning_part(""))]

    def delta(self, event: _Events, text: str) -> str:
        self.text += text
        return event("response.reasoning_text.delta", item_id=self.id,
                     output_index=self.index, content_index=0, delta=text)

    def close(self, event: _Events) -> tuple[list[str], dict[str, Any]]:
        part = reasoning_part(self.text)
        item = reasoning_item(self.id, "completed", [part])
        ids = {"item_id": self.id, "output_index": self.index}
        return [event("response.reasoning_text.done", **ids, content_index=0, text=self.text),
                event("response.content_part.done", **ids, content_index=0, part=part),
                event("response.output_item.done", output_index=self.index, item=item)], item


class _Call:
    """One function_call item, its arguments streamed as the chat path sends them."""

    def __init__(self, index: int, call_id: str, name: str) -> None:
        self.index, self.id, self.call_id, self.name = index, new_id("fc"), call_id, name
        self.arguments = ""

    def open(self, event: _Events) -> str:
        return event("response.output_item.added", output_index=self.index,
                     item=call_item(self.id, self.call_id, self.name, "", "in_progress"))

    def delta(self, event: _Events, arguments: str) -> str:
        self.arguments += arguments
        return event("response.function_call_arguments.delta", item_id=self.id,
                     output_index=self.index, delta=arguments)

    def close(self, event: _Events) -> tuple[list[str], dict[str, Any]]:
        item = call_item(self.id, self.call_id, self.name, self.arguments, "completed")
        return [event("response.function_call_arguments.done", item_id=self.id,
                      output_index=self.index, name=self.name, arguments=self.arguments),
                event("response.output_item.done", output_index=self.index, item=item)], item


async def response_events(head: ResponseHead, chunks: AsyncIterator[dict[str, Any]],
                          finished: Callable[[dict[str, Any]], None]
                          ) -> AsyncIterator[str]:
    """`finished(response)` gets the completed Response object (for the store)."""
    event = _Events()
    start = head.response("in_progress", [], None)
    yield event("response.created", response=start)
    yield event("response.in_progress", response=start)
    text: _Text | None = None
    thought: _Reasoning | None = None  # open while the reasoning streams
    calls: dict[int, _Call] = {}       # by the chat stream's tool call index
    items: list[dict[str, Any]] = []   # closed items, in output order
    open_count = 0
    finish = usage = None
    async for chunk in chunks:
        if "error" in chunk:
            error = chunk["error"]
            yield event("error", code=error.get("code"), message=error["message"],
                        param=error.get("param"))
            return
        if chunk.get("usage") is not None:
            usage = chunk["usage"]
        for choice in chunk["choices"]:
            delta = choice["delta"]
            if delta.get("reasoning_content"):
                if thought is None:
                    thought, open_count = _Reasoning(open_count), open_count + 1
                    for line in thought.open(event):
                        yield line
                yield thought.delta(event, delta["reasoning_content"])
            if thought is not None and (delta.get("content") or delta.get("tool_calls")):
                lines, item = thought.close(event)   # the answer begins: reasoning ended
                items.append(item)
                thought = None
                for line in lines:
                    yield line
            if delta.get("content"):
                if text is None:
                    text, open_count = _Text(open_count), open_count + 1
                    for line in text.open(event):
                        yield line
                yield text.delta(event, delta["content"],
                                 (choice.get("logprobs") or {}).get("content"))
            for part in delta.get("tool_calls") or []:
                call = calls.get(part["index"])
                if call is None:
                    if text is not None:   # text comes before calls: it is complete
                        lines, item = text.close(event)
                        items.append(item)
                        for line in lines:
                            yield line
                        text = None
                    call = calls[part["index"]] = _Call(open_count, part["id"],
                                                        part["function"]["name"])
                    open_count += 1
                    yield call.open(event)
                if part["function"].get("arguments"):
                    yield call.delta(event, part["function"]["arguments"])
            if choice.get("finish_reason") is not None:
                finish = choice["finish_reason"]
    for still_open in [one for one in (thought, text) if one is not None] + list(calls.values()):
        lines, item = still_open.close(event)
        items.append(item)
        for line in lines:
            yield line
    status = status_of(finish)
    response = head.response(status, items, usage_of(usage) if usage else None)
    finished(response)
    yield event(f"response.{status}", response=response)
