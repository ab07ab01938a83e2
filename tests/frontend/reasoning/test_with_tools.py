"""Reasoning beside tool calls, on the chat path's own answer builders (frontend/openai/
completions.py) fed the engine's events as the output loop queues them: calls are read
from the answer only (a call written while reasoning is reasoning text), whole and
streamed in pieces of every size, the reasoning first."""

from __future__ import annotations

import asyncio
import json
import random

import pytest

from folio.frontend.engine_api import FinalResult, SampleResult
from folio.frontend.openai.completions import _chat_message, _Job, _stream_chat
from folio.frontend.openai.tool_calls import ToolPlan
from folio.frontend.reasoning.parsers import Reasoning

HERMES = ToolPlan("auto", [], None, parser="hermes")
CALL = '<tool_call>{"name": "get_weather", "arguments": {"city": "Oslo"}}</tool_call>'
# The prompt opened <think>; the model drafts a call in its reasoning, then makes one.
OUTPUT = f"Maybe {CALL[:-12]}?\n</think>\n\nLet me check. {CALL}"
REASONING = f"Maybe {CALL[:-12]}?"


def test_whole_answer_calls_come_from_the_answer_only():
    message, finish = _chat_message(HERMES, OUTPUT, "stop", Reasoning("qwen3", True))
    assert message["reasoning_content"] == REASONING
    assert message["content"] == "Let me check."
    (call,) = message["tool_calls"]
    assert call["function"]["name"] == "get_weather"
    assert json.loads(call["function"]["arguments"]) == {"city": "Oslo"}
    assert finish == "tool_calls"


async def _stream(pieces: list[str]) -> list[dict]:
    queue: asyncio.Queue = asyncio.Queue()
    for i, piece in enumerate(pieces):
        queue.put_nowait(("delta", 0, piece, [i], None))
    sample = SampleResult(0, OUTPUT, list(range(len(pieces))), "stop", None, None)
    queue.put_nowait(("final", 0, FinalResult([sample], 5, None)))
    job = _Job(None, queue, ["r"], [[1, 2, 3, 4, 5]], 1)
    events = []
    async for event in _stream_chat(job, "chatcmpl-1", 0, "m", True, HERMES,
                                    Reasoning("qwen3", True)):
        if event.startswith("data: {"):
            events.append(json.loads(event[len("data: "):]))
    return events


@pytest.mark.parametrize("seed", range(20))
def test_streamed_in_any_pieces_reasoning_first_then_content_and_calls(seed):
    rng = random.Random(seed)
    pieces, at = [], 0
    while at < len(OUTPUT):
        size = rng.randint(1, 5)
        pieces.append(OUTPUT[at:at + size])
        at += size
    events = asyncio.run(_stream(pieces))
    deltas = [e["choices"][0]["delta"] for e in events if e["choices"]]
    reasoning = "".join(d.get("reasoning_content", "") for d in deltas)
    content = "".join(d.get("content") or "" for d in deltas)
    entries = [entry for d in deltas for entry in d.get("tool_calls", [])]
    assert reasoning == REASONING and content == "Let me check. "
    assert {entry["index"] for entry in entries} == {0}
    assert entries[0]["function"]["name"] == "get_weather"
    arguments = "".join(entry["function"].get("arguments", "") for entry in entries)
    assert json.loads(arguments) == {"city": "Oslo"}
    first_answer = next(i for i, d in enumerate(deltas) if d.get("content") or
                        d.get("tool_calls"))
    assert all("reasoning_content" not in d for d in deltas[first_answer:])
    assert [e["choices"][0]["finish_reason"] for e in events if e["choices"]][-1] == \
        "tool_calls"
    # Reasoning tokens: the deltas (one token each here) up to the one closing </think>.
    closing = next(i for i in range(len(pieces)) if "</think>" in "".join(pieces[:i + 1]))
    usage = events[-1]["usage"]
    assert usage["completion_tokens_details"]["reasoning_tokens"] == closing + 1
