"""Anthropic's Messages API through the official `anthropic` client against a real `folio
serve` (the `x-api-key` header): greedy text with a system prompt equals the same request
through chat completions; a tool_use -> tool_result round trip; stop_reason mapping; the
event stream; count_tokens; bad input refused in Anthropic's error shape, nothing left
allocated."""

from __future__ import annotations

import json

import anthropic
import httpx
import jsonschema
import pytest

from tests.frontend.agent_apis.conftest import KEY, MODEL, WEATHER, idle_stats

pytestmark = pytest.mark.slow
TOOL = {"name": "get_weather", "description": "Weather for a city", "input_schema": WEATHER}
CHAT_TOOL = {"type": "function", "function": {"name": "get_weather",
                                              "description": "Weather for a city",
                                              "parameters": WEATHER}}
SYSTEM = "Answer briefly."
# Current `anthropic` SDKs have no temperature argument; the server honours the field.
GREEDY = {"extra_body": {"temperature": 0}}


@pytest.fixture(scope="module")
def claude(server):
    return anthropic.Anthropic(base_url=server.base, api_key=KEY, max_retries=0)


def _chat(client, messages, **extra):
    return client.chat.completions.create(model=MODEL, messages=messages, max_tokens=8,
                                          temperature=0, **extra).choices[0]


def test_text_with_a_system_prompt_equals_chat_completions(claude, client):
    message = claude.messages.create(model=MODEL, max_tokens=8, **GREEDY, system=SYSTEM,
                                     messages=[{"role": "user", "content": "Hello there"}])
    chat = client.chat.completions.create(
        model=MODEL, max_tokens=8, temperature=0,
        messages=[{"role": "system", "content": SYSTEM},
                  {"role": "user", "content": "Hello there"}])
    choice = chat.choices[0]
    assert message.type == "message" and message.role == "assistant"
    assert message.content[0].type == "text"
    assert message.content[0].text == choice.message.content
    assert message.stop_reason == ("max_tokens" if choice.finish_reason == "length"
                                   else "end_turn")
    assert message.usage.input_tokens == chat.usage.prompt_tokens
    assert message.usage.output_tokens == chat.usage.completion_tokens
    # A stop sequence the greedy text holds ends it there, named.
    words = choice.message.content.split()
    if len(words) > 1:
        stopped = claude.messages.create(
            model=MODEL, max_tokens=8, **GREEDY, system=SYSTEM,
            stop_sequences=[words[1]], messages=[{"role": "user", "content": "Hello there"}])
        assert stopped.stop_reason == "stop_sequence" and stopped.stop_sequence == words[1]
        assert choice.message.content.startswith(stopped.content[0].text)


def test_tool_use_then_tool_result_round_trip(claude, client):
    asked = [{"role": "user", "content": "Weather in Paris?"}]
    first = claude.messages.create(model=MODEL, max_tokens=60, **GREEDY, tools=[TOOL],
                                   tool_choice={"type": "tool", "name": "get_weather"},
                                   messages=asked)
    assert first.stop_reason == "tool_use"
    (use,) = [block for block in first.content if block.type == "tool_use"]
    assert use.name == "get_weather" and use.id.startswith("toolu_")
    jsonschema.validate(use.input, WEATHER)
    second = claude.messages.create(
        model=MODEL, max_tokens=8, **GREEDY, tools=[TOOL], messages=asked + [
            {"role": "assistant", "content": first.content},
            {"role": "user", "content": [{"type": "tool_result", "tool_use_id": use.id,
                                          "content": "sunny, 21 degrees"}]}])
    expected = _chat(client, [
        {"role": "user", "content": "Weather in Paris?"},
        {"role": "assistant", "tool_calls": [{"id": use.id, "type": "function", "function": {
            "name": "get_weather", "arguments": json.dumps(use.input)}}]},
        {"role": "tool", "tool_call_id": use.id, "content": "sunny, 21 degrees"}],
        tools=[CHAT_TOOL])
    assert second.content[0].text == expected.message.content
    # `any`: some declared tool is called, whatever the model writes.
    any_tool = claude.messages.create(model=MODEL, max_tokens=80, tools=[TOOL],
                                      extra_body={"temperature": 1.0}, messages=asked,
                                      tool_choice={"type": "any",
                                                   "disable_parallel_tool_use": True})
    assert any_tool.stop_reason == "tool_use"
    (use,) = [block for block in any_tool.content if block.type == "tool_use"]
    jsonschema.validate(use.input, WEATHER)


def test_stream_events_text_and_tool_use(claude):
    asked = [{"role": "user", "content": "Stream this"}]
    expected = claude.messages.create(model=MODEL, max_tokens=8, **GREEDY, system=SYSTEM,
                                      messages=asked)
    with claude.messages.stream(model=MODEL, max_tokens=8, **GREEDY, system=SYSTEM,
                                messages=asked) as stream:
        events = list(stream)
        final = stream.get_final_message()
    kinds = [event.type for event in events if event.type not in ("text", "input_json")]
    assert kinds[:2] == ["message_start", "content_block_start"]
    assert kinds[-3:] == ["content_block_stop", "message_delta", "message_stop"]
    text = "".join(event.delta.text for event in events if event.type == "content_block_delta")
    assert text == final.content[0].text == expected.content[0].text
    assert final.stop_reason == expected.stop_reason
    assert final.usage.input_tokens == expected.usage.input_tokens
    assert final.usage.output_tokens == expected.usage.output_tokens
    with claude.messages.stream(model=MODEL, max_tokens=60, **GREEDY, tools=[TOOL],
                                tool_choice={"type": "tool", "name": "get_weather"},
                                messages=[{"role": "user", "content": "Weather?"}]) as stream:
        events = list(stream)
        final = stream.get_final_message()
    partial = "".join(event.delta.partial_json for event in events
                      if event.type == "content_block_delta"
                      and event.delta.type == "input_json_delta")
    (use,) = final.content
    assert use.type == "tool_use" and final.stop_reason == "tool_use"
    assert json.loads(partial) == use.input
    jsonschema.validate(use.input, WEATHER)


def test_json_schema_through_output_config(claude):
    answer = claude.messages.create(
        model=MODEL, max_tokens=80, extra_body={"temperature": 1.0, "seed": 5},
        messages=[{"role": "user", "content": "The weather as JSON"}],
        output_config={"format": {"type": "json_schema", "schema": WEATHER}})
    jsonschema.validate(json.loads(answer.content[0].text), WEATHER)


def test_count_tokens_is_what_the_prompt_costs(claude):
    messages = [{"role": "user", "content": "How many tokens is this?"}]
    counted = claude.messages.count_tokens(model=MODEL, system=SYSTEM, messages=messages,
                                           tools=[TOOL])
    sent = claude.messages.create(model=MODEL, max_tokens=1, system=SYSTEM, tools=[TOOL],
                                  tool_choice={"type": "auto"}, messages=messages)
    assert counted.input_tokens == sent.usage.input_tokens > 0
    bare = claude.messages.count_tokens(model=MODEL, messages=messages)
    assert 0 < bare.input_tokens < counted.input_tokens   # the tools are in the prompt


@pytest.mark.parametrize("fields, says", [
    ({"max_tokens": None}, "max_tokens"),
    ({"thinking": {"type": "enabled", "budget_tokens": 1024}}, "--reasoning-parser"),
    ({"mcp_servers": []}, "mcp_servers"),
    ({"messages": [{"role": "system", "content": "x"}]}, "role"),
    ({"messages": [{"role": "user", "content": [{"type": "image", "source": {}}]}]},
     "'image'"),
    ({"tools": [{"type": "web_search_20250305", "name": "web_search"}]}, "web_search"),
    ({"model": "nobody"}, "nobody"),
])
def test_bad_input_is_an_anthropic_error(server, fields, says):
    body = {"model": MODEL, "max_tokens": 4,
            "messages": [{"role": "user", "content": "hi"}], **fields}
    answer = httpx.post(f"{server.base}/v1/messages", json=body,
                        headers={"x-api-key": KEY}, timeout=30)
    assert answer.status_code == (404 if fields.get("model") else 400)
    payload = answer.json()
    assert payload["type"] == "error" and says in payload["error"]["message"]
    assert payload["error"]["type"] == ("not_found_error" if fields.get("model")
                                        else "invalid_request_error")
    assert "Traceback" not in answer.text
    stats = idle_stats(server)
    assert stats["kv_blocks_free"] == stats["kv_blocks_total"]


def test_the_key_is_checked_in_anthropic_shape(server):
    for headers in ({}, {"x-api-key": "wrong"}):
        answer = httpx.post(f"{server.base}/v1/messages", headers=headers, timeout=30, json={
            "model": MODEL, "max_tokens": 1, "messages": [{"role": "user", "content": "hi"}]})
        assert answer.status_code == 401
        assert answer.json()["error"]["type"] == "authentication_error"
    counted = httpx.post(f"{server.base}/v1/messages/count_tokens", timeout=30,
                         headers={"Authorization": f"Bearer {KEY}"},
                         json={"model": MODEL, "messages": [{"role": "user", "content": "hi"}]})
    assert counted.status_code == 200 and counted.json()["input_tokens"] > 0


WRONG = (None, True, -1, 1.5, "x", [{"type": 1}], {"type": 1})


def test_wrong_types_in_every_field_of_both_routes(server):
    """Every field of each route given each wrong-typed value: a 2xx or a 4xx in that API's
    own shape, never a 500."""
    routes = (
        ("/v1/messages", {"model": MODEL, "max_tokens": 1, "system": "s", "stop_sequences": ["x"],
                          "messages": [{"role": "user", "content": "hi"}], "tools": [TOOL],
                          "tool_choice": {"type": "auto"}, "metadata": {"user_id": "u"}},
         lambda body: body["type"] == "error" and body["error"]["message"]),
        ("/v1/responses", {"model": MODEL, "input": "hi", "max_output_tokens": 1,
                           "instructions": "s", "tools": [{"type": "function", "name": "f",
                                                           "parameters": WEATHER}],
                           "tool_choice": "auto", "text": {"format": {"type": "text"}},
                           "include": [], "metadata": {}, "previous_response_id": None},
         lambda body: body["error"]["message"]))
    with httpx.Client(base_url=server.base, timeout=30,
                      headers={"Authorization": f"Bearer {KEY}"}) as http:
        for path, base, shaped in routes:
            for field in base:
                for value in WRONG:
                    answer = http.post(path, json={**base, field: value})
                    assert answer.status_code < 500, (path, field, value, answer.text)
                    if answer.status_code >= 400:
                        assert shaped(answer.json()), (path, field, value, answer.text)
            for value in WRONG:   # inside the first message / input item too
                item = {"role": "user", "content": value}
                answer = http.post(path, json={**base, "messages" if "messages" in base
                                               else "input": [item]})
                assert answer.status_code < 500, (path, value, answer.text)
    stats = idle_stats(server)
    assert stats["kv_blocks_free"] == stats["kv_blocks_total"]
