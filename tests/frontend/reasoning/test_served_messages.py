"""/v1/messages on a model that reasons, through the official anthropic SDK: a thinking
block before the text (whole and streamed: thinking_delta, then signature_delta), the
thinking switch, thinking blocks of earlier turns into the prompt, and bad thinking
requests refused in Anthropic's error shape."""

from __future__ import annotations

import anthropic
import httpx
import pytest

from tests.frontend.reasoning.checkpoint import ANSWER_TEXT, REASONING
from tests.frontend.reasoning.conftest import KEY, MODEL

ASK = [{"role": "user", "content": "2+2?"}]
THINK = {"type": "enabled", "budget_tokens": 1024}
GREEDY = {"extra_body": {"temperature": 0}}


@pytest.fixture(scope="module")
def claude(server):
    return anthropic.Anthropic(base_url=server.base, api_key=KEY, max_retries=0)


def test_a_thinking_block_before_the_text(claude):
    message = claude.messages.create(model=MODEL, max_tokens=2000, messages=ASK,
                                     thinking=THINK, **GREEDY)
    thinking, text = message.content
    assert thinking.type == "thinking" and thinking.thinking == REASONING
    assert thinking.signature == ""
    assert text.type == "text" and text.text == ANSWER_TEXT
    assert message.stop_reason == "end_turn"


def test_streamed_thinking_then_text(claude):
    with claude.messages.stream(model=MODEL, max_tokens=2000, messages=ASK, thinking=THINK,
                                **GREEDY) as stream:
        events = list(stream)
        final = stream.get_final_message()
    raw = [e for e in events if e.type in ("content_block_start", "content_block_delta",
                                           "content_block_stop")]
    assert raw[0].type == "content_block_start" and raw[0].content_block.type == "thinking"
    kinds = [(e.type, getattr(getattr(e, "delta", None), "type", None), e.index) for e in raw]
    signature = kinds.index(("content_block_delta", "signature_delta", 0))
    assert kinds[signature + 1] == ("content_block_stop", None, 0)
    assert all(kind[1] == "thinking_delta" for kind in kinds[1:signature])
    assert len(kinds[1:signature]) > 1
    assert kinds[signature + 2][0] == "content_block_start" and raw[signature + 2].index == 1
    assert "".join(e.delta.thinking for e in raw[1:signature]) == REASONING
    assert [block.type for block in final.content] == ["thinking", "text"]
    assert final.content[0].thinking == REASONING and final.content[1].text == ANSWER_TEXT


def test_thinking_disabled_turns_it_off(claude):
    message = claude.messages.create(model=MODEL, max_tokens=40, messages=ASK,
                                     thinking={"type": "disabled"}, **GREEDY)
    assert [block.type for block in message.content] == ["text"]
    assert message.content[0].text == " " + ANSWER_TEXT


def test_thinking_blocks_of_earlier_turns_reach_the_prompt(claude):
    def turns(reply):
        return [*ASK, {"role": "assistant", "content": reply},
                {"role": "user", "content": "Sure?"}]

    text = {"type": "text", "text": ANSWER_TEXT}
    thought = {"type": "thinking", "thinking": REASONING, "signature": ""}
    plain = claude.messages.count_tokens(model=MODEL, messages=turns([text]))
    reasoned = claude.messages.count_tokens(model=MODEL, messages=turns([thought, text]))
    assert reasoned.input_tokens > plain.input_tokens
    answer = claude.messages.create(model=MODEL, max_tokens=1, messages=turns([thought, text]))
    assert answer.usage.input_tokens == reasoned.input_tokens


@pytest.mark.parametrize("fields", [
    {"thinking": {"type": "enabled", "budget_tokens": 2000}, "max_tokens": 2000},
    {"thinking": {"type": "enabled", "budget_tokens": 100}, "max_tokens": 2000},
    {"thinking": {"type": "adaptive"}, "max_tokens": 2000},
    {"thinking": THINK, "max_tokens": 2000, "tool_choice": {"type": "any"},
     "tools": [{"name": "f", "input_schema": {"type": "object"}}]},
    {"max_tokens": 20, "messages": [{"role": "assistant", "content": [
        {"type": "redacted_thinking", "data": "x"}]}]},
])
def test_bad_thinking_is_a_400_in_anthropics_shape(server, fields):
    body = {"model": MODEL, "messages": ASK, **fields}
    answer = httpx.post(f"{server.base}/v1/messages", json=body, headers={"x-api-key": KEY})
    assert answer.status_code == 400
    error = answer.json()
    assert error["type"] == "error" and error["error"]["type"] == "invalid_request_error"
    assert "thinking" in error["error"]["message"]
