"""/v1/responses on a model that reasons, through the official openai SDK: a reasoning item
before the message (whole and streamed, events in the spec's order), reasoning_tokens,
reasoning.effort, and reasoning items sent back (as input, or through
previous_response_id) rendered into the prompt."""

from __future__ import annotations

import openai
import pytest

from tests.frontend.reasoning.checkpoint import ANSWER_TEXT, REASONING
from tests.frontend.reasoning.conftest import MODEL


def test_a_reasoning_item_before_the_message(client, reasoning_tokens):
    response = client.responses.create(model=MODEL, input="2+2?", max_output_tokens=40,
                                       temperature=0)
    reasoning, message = response.output
    assert reasoning.type == "reasoning" and reasoning.summary == []
    assert [(part.type, part.text) for part in reasoning.content] == [
        ("reasoning_text", REASONING)]
    assert message.type == "message" and response.output_text == ANSWER_TEXT
    assert response.usage.output_tokens_details.reasoning_tokens == reasoning_tokens
    assert response.status == "completed"


def test_streamed_reasoning_events_in_order(client, reasoning_tokens):
    with client.responses.stream(model=MODEL, input="2+2?", max_output_tokens=40,
                                 temperature=0) as stream:
        events = list(stream)
        final = stream.get_final_response()
    kinds = [event.type for event in events]
    deltas = [i for i, kind in enumerate(kinds) if kind == "response.reasoning_text.delta"]
    assert len(deltas) > 1
    head = kinds[:deltas[0]]
    assert head == ["response.created", "response.in_progress", "response.output_item.added",
                    "response.content_part.added"]
    assert events[2].item.type == "reasoning" and events[3].part.type == "reasoning_text"
    after = kinds[deltas[-1] + 1:]
    assert after[:4] == ["response.reasoning_text.done", "response.content_part.done",
                         "response.output_item.done", "response.output_item.added"]
    assert after[-1] == "response.completed"
    assert "".join(events[i].delta for i in deltas) == REASONING
    done = events[deltas[-1] + 1]
    assert done.text == REASONING and done.output_index == 0
    assert events[deltas[-1] + 4].item.type == "message"
    assert events[deltas[-1] + 4].output_index == 1
    assert [item.type for item in final.output] == ["reasoning", "message"]
    assert final.output[0].content[0].text == REASONING
    assert final.output_text == ANSWER_TEXT
    assert final.usage.output_tokens_details.reasoning_tokens == reasoning_tokens
    assert [e.sequence_number for e in events] == list(range(len(events)))


def test_reasoning_effort_none_turns_thinking_off(client):
    response = client.responses.create(model=MODEL, input="2+2?", max_output_tokens=40,
                                       temperature=0, reasoning={"effort": "none"})
    assert [item.type for item in response.output] == ["message"]
    assert response.output_text == " " + ANSWER_TEXT
    assert response.reasoning.effort == "none"


def test_reasoning_items_sent_back_reach_the_prompt(client):
    first = client.responses.create(model=MODEL, input="2+2?", max_output_tokens=40,
                                    temperature=0)
    follow = {"role": "user", "content": "Sure?"}
    chained = client.responses.create(model=MODEL, previous_response_id=first.id,
                                      input=[follow], max_output_tokens=1)
    sent_back = client.responses.create(
        model=MODEL, max_output_tokens=1,
        input=[{"role": "user", "content": "2+2?"},
               *[item.model_dump(exclude_none=True) for item in first.output], follow])
    without = client.responses.create(
        model=MODEL, max_output_tokens=1,
        input=[{"role": "user", "content": "2+2?"},
               first.output[1].model_dump(exclude_none=True), follow])
    assert chained.usage.input_tokens == sent_back.usage.input_tokens
    assert sent_back.usage.input_tokens > without.usage.input_tokens


@pytest.mark.parametrize("reasoning, param", [
    ({"effort": "minimal"}, "reasoning.effort"),
    ({"effort": "low", "summary": "auto"}, "reasoning.summary"),
    ({"generate_summary": "auto"}, "reasoning.generate_summary")])
def test_unsupported_reasoning_fields_are_refused_by_name(client, reasoning, param):
    with pytest.raises(openai.BadRequestError) as refused:
        client.responses.create(model=MODEL, input="2+2?", reasoning=reasoning)
    assert refused.value.body["param"] == param


def test_encrypted_reasoning_is_refused_by_name(client):
    with pytest.raises(openai.BadRequestError) as refused:
        client.responses.create(model=MODEL, input=[
            {"type": "reasoning", "id": "rs_1", "summary": [], "encrypted_content": "x"},
            {"role": "user", "content": "hi"}])
    assert refused.value.body["param"] == "input"
    assert "encrypted_content" in refused.value.body["message"]
