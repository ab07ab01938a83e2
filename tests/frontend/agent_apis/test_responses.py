"""OpenAI's Responses API through the official `openai` client against a real `folio
serve`: greedy text equals the same request through chat completions; a function call
round trip; json_schema through text.format; previous_response_id chains, GET, DELETE,
store false and eviction; the event stream; bad input refused by name in OpenAI's shape,
nothing left allocated."""

from __future__ import annotations

import json

import httpx
import jsonschema
import openai
import pytest

from tests.frontend.agent_apis.conftest import KEY, MODEL, STORE_SIZE, WEATHER, idle_stats

pytestmark = pytest.mark.slow
TOOL = {"type": "function", "name": "get_weather", "description": "Weather for a city",
        "parameters": WEATHER, "strict": True}
GREEDY = {"temperature": 0, "max_output_tokens": 8}


def _chat(client, messages, **extra) -> str:
    answer = client.chat.completions.create(model=MODEL, messages=messages, max_tokens=8,
                                            temperature=0, **extra)
    return answer.choices[0].message.content


def test_text_equals_chat_completions(client):
    response = client.responses.create(model=MODEL, input="The weather in Paris",
                                       instructions="Answer briefly.", **GREEDY)
    chat = client.chat.completions.create(
        model=MODEL, max_tokens=8, temperature=0,
        messages=[{"role": "system", "content": "Answer briefly."},
                  {"role": "user", "content": "The weather in Paris"}])
    assert response.object == "response" and response.id.startswith("resp_")
    assert response.output_text == chat.choices[0].message.content
    assert response.usage.input_tokens == chat.usage.prompt_tokens
    assert response.usage.output_tokens == chat.usage.completion_tokens
    finish = chat.choices[0].finish_reason
    assert response.status == ("incomplete" if finish == "length" else "completed")
    if finish == "length":
        assert response.incomplete_details.reason == "max_output_tokens"
    # The message-array form, with text parts and a developer turn, is the same request.
    items = client.responses.create(model=MODEL, **GREEDY, input=[
        {"role": "developer", "content": "Answer briefly."},
        {"type": "message", "role": "user",
         "content": [{"type": "input_text", "text": "The weather in Paris"}]}])
    assert items.output_text == response.output_text
    # Log-probs, asked the Responses way, are the chat route's.
    scored = client.responses.create(model=MODEL, input="The weather in Paris", **GREEDY,
                                     include=["message.output_text.logprobs"], top_logprobs=2)
    chat_scored = client.chat.completions.create(
        model=MODEL, max_tokens=8, temperature=0, logprobs=True, top_logprobs=2,
        messages=[{"role": "user", "content": "The weather in Paris"}])
    got = scored.output[0].content[0].logprobs
    want = chat_scored.choices[0].logprobs.content
    assert [(e.token, e.logprob, len(e.top_logprobs)) for e in got] == [
        (e.token, e.logprob, len(e.top_logprobs)) for e in want]
    assert len(got) == scored.usage.output_tokens


def test_function_call_round_trip_through_previous_response_id(client):
    first = client.responses.create(model=MODEL, input="Weather in Paris?", tools=[TOOL],
                                    tool_choice={"type": "function", "name": "get_weather"},
                                    max_output_tokens=60, temperature=0)
    (call,) = first.output
    assert call.type == "function_call" and call.name == "get_weather"
    arguments = json.loads(call.arguments)
    jsonschema.validate(arguments, WEATHER)
    second = client.responses.create(
        model=MODEL, previous_response_id=first.id, tools=[TOOL], **GREEDY,
        input=[{"type": "function_call_output", "call_id": call.call_id,
                "output": "sunny, 21 degrees"}])
    expected = _chat(client, [
        {"role": "user", "content": "Weather in Paris?"},
        {"role": "assistant", "tool_calls": [{"id": call.call_id, "type": "function",
                                              "function": {"name": "get_weather",
                                                           "arguments": call.arguments}}]},
        {"role": "tool", "tool_call_id": call.call_id, "content": "sunny, 21 degrees"}],
        tools=[{"type": "function", "function": {"name": "get_weather",
                                                 "description": "Weather for a city",
                                                 "parameters": WEATHER}}])
    assert second.output_text == expected
    # `required`: a call of a declared tool, whatever the model writes.
    required = client.responses.create(model=MODEL, input="Weather?", tools=[TOOL],
                                       tool_choice="required", parallel_tool_calls=False,
                                       max_output_tokens=80, temperature=1.0,
                                       extra_body={"seed": 3})
    (call,) = [item for item in required.output if item.type == "function_call"]
    jsonschema.validate(json.loads(call.arguments), WEATHER)


def test_json_schema_through_text_format(client):
    response = client.responses.create(
        model=MODEL, input="Describe the weather as JSON", max_output_tokens=80,
        temperature=1.0, extra_body={"seed": 7},
        text={"format": {"type": "json_schema", "name": "weather", "schema": WEATHER,
                         "strict": True}})
    jsonschema.validate(json.loads(response.output_text), WEATHER)
    assert response.text.format.type == "json_schema"


def test_previous_response_id_chains_get_delete_and_eviction(client):
    first = client.responses.create(model=MODEL, input="One", **GREEDY)
    second = client.responses.create(model=MODEL, input="Two", previous_response_id=first.id,
                                     **GREEDY)
    third = client.responses.create(model=MODEL, input="Three",
                                    previous_response_id=second.id, **GREEDY)
    assert third.previous_response_id == second.id
    assert third.output_text == _chat(client, [
        {"role": "user", "content": "One"}, {"role": "assistant", "content": first.output_text},
        {"role": "user", "content": "Two"}, {"role": "assistant", "content": second.output_text},
        {"role": "user", "content": "Three"}])
    fetched = client.responses.retrieve(third.id)
    assert fetched.id == third.id and fetched.output_text == third.output_text
    client.responses.delete(third.id)
    with pytest.raises(openai.NotFoundError, match=third.id):
        client.responses.retrieve(third.id)
    unkept = client.responses.create(model=MODEL, input="x", store=False, **GREEDY)
    with pytest.raises(openai.NotFoundError, match=unkept.id):
        client.responses.retrieve(unkept.id)
    # The least recently used goes first: `first` is touched, so `second` is evicted.
    client.responses.retrieve(first.id)
    for _ in range(STORE_SIZE - 1):
        client.responses.create(model=MODEL, input="filler", **GREEDY)
    assert client.responses.retrieve(first.id).id == first.id
    with pytest.raises(openai.NotFoundError, match=second.id) as refused:
        client.responses.create(model=MODEL, input="Four", previous_response_id=second.id,
                                **GREEDY)
    assert refused.value.body["param"] == "previous_response_id"


def test_stream_events_text_and_function_call(client):
    expected = client.responses.create(model=MODEL, input="Stream this", **GREEDY)
    with client.responses.stream(model=MODEL, input="Stream this", **GREEDY) as stream:
        events = list(stream)
    kinds = [event.type for event in events]
    assert [event.sequence_number for event in events] == list(range(len(events)))
    assert kinds[:5] == ["response.created", "response.in_progress",
                         "response.output_item.added", "response.content_part.added",
                         "response.output_text.delta"]
    assert kinds[-4:] == ["response.output_text.done", "response.content_part.done",
                          "response.output_item.done", f"response.{expected.status}"]
    text = "".join(event.delta for event in events if event.type == "response.output_text.delta")
    assert text == expected.output_text == events[-1].response.output_text
    with client.responses.stream(model=MODEL, input="Weather?", tools=[TOOL],
                                 tool_choice={"type": "function", "name": "get_weather"},
                                 max_output_tokens=60, temperature=0) as stream:
        events = list(stream)
        final = stream.get_final_response()
    arguments = "".join(event.delta for event in events
                        if event.type == "response.function_call_arguments.delta")
    (call,) = final.output
    assert call.type == "function_call" and call.arguments == arguments
    jsonschema.validate(json.loads(arguments), WEATHER)
    assert "response.function_call_arguments.done" in [event.type for event in events]
    assert client.responses.retrieve(final.id).output[0].arguments == arguments


@pytest.mark.parametrize("fields, param", [
    ({"reasoning": {"effort": "high"}}, "reasoning.effort"),   # no --reasoning-parser
    ({"background": True}, "background"),
    ({"tools": [{"type": "web_search"}]}, "tools"),
    ({"input": [{"role": "user", "content": [{"type": "input_image", "image_url": "x"}]}]},
     "input"),
    ({"max_output_tokens": 0}, "max_output_tokens"),
    ({"text": {"format": {"type": "regex"}}}, "text.format"),
    ({"include": ["file_search_call.results"]}, "include"),
    ({"previous_response_id": "resp_nobody"}, "previous_response_id"),
])
def test_bad_input_is_a_400_naming_the_field(server, fields, param):
    body = {"model": MODEL, "input": "hi", **fields}
    answer = httpx.post(f"{server.base}/v1/responses", json=body,
                        headers={"Authorization": f"Bearer {KEY}"}, timeout=30)
    assert answer.status_code == (404 if param == "previous_response_id" else 400)
    error = answer.json()["error"]
    assert error["param"] == param and error["message"] and "Traceback" not in answer.text
    stats = idle_stats(server)
    assert stats["kv_blocks_free"] == stats["kv_blocks_total"]


def test_reasoning_items_are_dropped_without_a_reasoning_parser(client):
    """As OpenAI drops them for a model that does not reason: accepted, not rendered."""
    turn = [{"role": "user", "content": "Hello"},
            {"type": "message", "role": "assistant", "content": "Hi"},
            {"role": "user", "content": "Again"}]
    thought = {"type": "reasoning", "id": "rs_1", "summary": [],
               "content": [{"type": "reasoning_text", "text": "they greet me twice"}]}
    plain = client.responses.create(model=MODEL, input=turn, max_output_tokens=1)
    reasoned = client.responses.create(model=MODEL, input=[turn[0], thought, *turn[1:]],
                                       max_output_tokens=1)
    assert reasoned.usage.input_tokens == plain.usage.input_tokens
    assert reasoned.usage.output_tokens_details.reasoning_tokens == 0
