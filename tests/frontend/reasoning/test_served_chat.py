"""Chat completions on a model that reasons (conftest.py's server, --reasoning-parser
qwen3), through the official openai SDK: reasoning_content apart from content, whole and
streamed, reasoning_tokens, the template's thinking switch, and stop strings."""

from __future__ import annotations

from tests.frontend.reasoning.checkpoint import ANSWER_TEXT, REASONING
from tests.frontend.reasoning.conftest import MODEL

ASK = [{"role": "user", "content": "2+2?"}]


def test_reasoning_content_apart_from_the_answer(client, reasoning_tokens):
    answer = client.chat.completions.create(model=MODEL, messages=ASK, max_tokens=40,
                                            temperature=0)
    message = answer.choices[0].message
    assert message.reasoning_content == REASONING
    assert message.content == ANSWER_TEXT
    assert answer.choices[0].finish_reason == "stop"
    assert answer.usage.completion_tokens_details.reasoning_tokens == reasoning_tokens
    assert answer.usage.completion_tokens > reasoning_tokens


def test_streamed_reasoning_then_content(client, reasoning_tokens):
    stream = client.chat.completions.create(
        model=MODEL, messages=ASK, max_tokens=40, temperature=0, stream=True,
        stream_options={"include_usage": True})
    chunks = list(stream)
    deltas = [c.choices[0].delta for c in chunks if c.choices]
    reasoning = [getattr(d, "reasoning_content", None) or "" for d in deltas]
    content = [d.content or "" for d in deltas]
    assert "".join(reasoning) == REASONING and "".join(content) == ANSWER_TEXT
    assert sum(1 for piece in reasoning if piece) > 1   # it streamed, token by token
    last_reasoning = max(i for i, piece in enumerate(reasoning) if piece)
    assert all(not piece for piece in content[:last_reasoning + 1])   # reasoning first
    usage = chunks[-1].usage
    assert usage.completion_tokens_details.reasoning_tokens == reasoning_tokens


def test_thinking_turned_off_through_the_template(client):
    for extra in ({"reasoning_effort": "none"},
                  {"chat_template_kwargs": {"enable_thinking": False}}):
        answer = client.chat.completions.create(model=MODEL, messages=ASK, max_tokens=40,
                                                temperature=0, extra_body=extra)
        message = answer.choices[0].message
        # No reasoning: the answer as written (the prompt ended at "</think>").
        assert message.reasoning_content is None, extra
        assert message.content == " " + ANSWER_TEXT, extra
        assert answer.usage.completion_tokens_details.reasoning_tokens == 0


def test_a_stop_string_in_the_reasoning_ends_the_answer_there(client):
    answer = client.chat.completions.create(model=MODEL, messages=ASK, max_tokens=40,
                                            temperature=0, stop=[" add"])
    message = answer.choices[0].message
    assert message.reasoning_content == "Let me" and message.content == ""
    assert answer.choices[0].finish_reason == "stop"


def test_earlier_reasoning_goes_to_the_template(client):
    turn = [*ASK, {"role": "assistant", "content": ANSWER_TEXT}, {"role": "user",
                                                                   "content": "Sure?"}]
    plain = client.chat.completions.create(model=MODEL, messages=turn, max_tokens=1)
    turn[1] = {**turn[1], "reasoning_content": REASONING}
    reasoned = client.chat.completions.create(model=MODEL, messages=turn, max_tokens=1)
    assert reasoned.usage.prompt_tokens > plain.usage.prompt_tokens


def test_bad_reasoning_fields_are_400s_naming_them(client):
    import openai
    import pytest

    for extra, param in (({"reasoning_effort": "extreme"}, "reasoning_effort"),
                         ({"chat_template_kwargs": {"tools": []}}, "chat_template_kwargs"),
                         ({"reasoning_effort": "high", "response_format": {
                             "type": "json_object"}}, "reasoning_effort")):
        with pytest.raises(openai.BadRequestError) as refused:
            client.chat.completions.create(model=MODEL, messages=ASK, max_tokens=5,
                                           extra_body=extra)
        assert refused.value.body["param"] == param, extra
