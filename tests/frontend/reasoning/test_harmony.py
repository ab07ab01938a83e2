"""gpt-oss's harmony answers on the chat path (--reasoning-parser gpt_oss): the request
keeps special tokens in its text (harmony's markers are special tokens), the answer
builders split analysis from final whole and streamed, and the reasoning tokens are those
up to the final message's header, read from real token ids of a tokenizer whose harmony
markers are special tokens."""

from __future__ import annotations

import asyncio
import json

import pytest

from folio.frontend.engine_api import FinalResult, SampleResult
from folio.frontend.openai.completions import _chat_message, _Job, _stream_chat
from folio.frontend.openai.requests import ChatRequest, ServerTerms
from folio.frontend.openai.tool_calls import ToolPlan
from folio.frontend.reasoning.parsers import Reasoning
from folio.frontend.reasoning.tokens import reasoning_tokens

MARKERS = ["<|channel|>", "<|message|>", "<|end|>", "<|start|>", "<|return|>"]
OUTPUT = ("<|channel|>analysis<|message|>The user greets; reply kindly.<|end|>"
          "<|start|>assistant<|channel|>final<|message|>Hello there!<|return|>")
NONE = ToolPlan("none", None, None)


@pytest.fixture(scope="module")
def harmony_tokenizer(tokenizer_dir):
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(str(tokenizer_dir))
    tokenizer.add_special_tokens({"additional_special_tokens": MARKERS})
    return tokenizer


def test_a_gpt_oss_request_keeps_special_tokens():
    body = {"messages": [{"role": "user", "content": "hi"}]}
    assert not ChatRequest.parse(body, ServerTerms(5, None, True, "gpt_oss")) \
        .params.skip_special_tokens
    assert ChatRequest.parse(body, ServerTerms(5, None, True, "qwen3")) \
        .params.skip_special_tokens
    held = {**body, "response_format": {"type": "json_object"}}   # read whole: no split
    parsed = ChatRequest.parse(held, ServerTerms(5, None, True, "gpt_oss"))
    assert parsed.reasoning_parser is None and parsed.params.skip_special_tokens


def test_whole_and_streamed_split(harmony_tokenizer):
    message, _ = _chat_message(NONE, OUTPUT, "stop", Reasoning("gpt_oss"))
    assert message == {"role": "assistant", "reasoning_content":
                       "The user greets; reply kindly.", "content": "Hello there!"}
    ids = harmony_tokenizer.encode(OUTPUT, add_special_tokens=False)
    pieces = [harmony_tokenizer.decode([i], skip_special_tokens=False) for i in ids]
    assert "".join(pieces) == OUTPUT
    events = asyncio.run(_stream(pieces))
    deltas = [e["choices"][0]["delta"] for e in events if e["choices"]]
    assert "".join(d.get("reasoning_content", "") for d in deltas) == \
        message["reasoning_content"]
    assert "".join(d.get("content") or "" for d in deltas) == "Hello there!"
    message_id = harmony_tokenizer.convert_tokens_to_ids("<|message|>")
    answer_header = [i for i, token in enumerate(ids) if token == message_id][1]
    assert events[-1]["usage"]["completion_tokens_details"]["reasoning_tokens"] == \
        answer_header + 1
    assert reasoning_tokens(Reasoning("gpt_oss"), harmony_tokenizer, ids) == \
        answer_header + 1


async def _stream(pieces: list[str]) -> list[dict]:
    queue: asyncio.Queue = asyncio.Queue()
    for i, piece in enumerate(pieces):
        queue.put_nowait(("delta", 0, piece, [i], None))
    sample = SampleResult(0, OUTPUT, list(range(len(pieces))), "stop", None, None)
    queue.put_nowait(("final", 0, FinalResult([sample], 3, None)))
    job = _Job(None, queue, ["r"], [[1, 2, 3]], 1)
    return [json.loads(event[len("data: "):])
            async for event in _stream_chat(job, "c", 0, "m", True, NONE,
                                            Reasoning("gpt_oss"))
            if event.startswith("data: {")]
