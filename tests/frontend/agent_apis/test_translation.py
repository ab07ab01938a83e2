"""The translations onto the chat path, without a server: Responses input items and
Anthropic content blocks as chat messages, the chat path's refusals renamed, the response
store's LRU bound."""

from __future__ import annotations

import pytest

from folio.frontend.anthropic.request import MessagesRequest
from folio.frontend.chat_bridge import renamed
from folio.frontend.openai.errors import ApiError
from folio.frontend.openai.responses.input_items import input_messages, output_message
from folio.frontend.openai.responses.request import RENAMES, ResponsesRequest
from folio.frontend.openai.responses.store import ResponseStore, Stored


def test_responses_items_become_one_assistant_turn_per_turn():
    messages = input_messages([
        {"role": "user", "content": "hi"},
        {"type": "message", "role": "assistant", "id": "msg_1", "status": "completed",
         "content": [{"type": "output_text", "text": "let me look", "annotations": []}]},
        {"type": "function_call", "id": "fc_1", "call_id": "c1", "name": "f",
         "arguments": "{}"},
        {"type": "function_call", "call_id": "c2", "name": "g", "arguments": "{\"a\": 1}"},
        {"type": "function_call_output", "call_id": "c1", "output": "one"},
        {"type": "function_call_output", "call_id": "c2",
         "output": [{"type": "input_text", "text": "two"}]}])
    assert messages == [
        {"role": "user", "content": "hi"},
        {"role": "assistant", "content": "let me look", "tool_calls": [
            {"id": "c1", "type": "function", "function": {"name": "f", "arguments": "{}"}},
            {"id": "c2", "type": "function",
             "function": {"name": "g", "arguments": "{\"a\": 1}"}}]},
        {"role": "tool", "tool_call_id": "c1", "content": "one"},
        {"role": "tool", "tool_call_id": "c2", "content": "two"}]
    assert output_message([{"type": "function_call", "call_id": "c9", "name": "f",
                            "arguments": "{}"}])["tool_calls"][0]["id"] == "c9"
    for bad in ([{"type": "reasoning", "summary": []}], [{"role": "tool", "content": "x"}],
                [{"type": "function_call_output", "output": "x"}], []):
        with pytest.raises(ApiError) as refused:
            input_messages(bad)
        assert refused.value.status == 400 and refused.value.param == "input"


def test_responses_body_as_a_chat_body():
    parsed = ResponsesRequest.parse({
        "input": "q", "instructions": "sys", "max_output_tokens": 5, "stream": True,
        "text": {"format": {"type": "json_schema", "name": "n", "schema": {"type": "object"}}},
        "tools": [{"type": "function", "name": "f", "parameters": {"type": "object"},
                   "strict": True}],
        "tool_choice": {"type": "function", "name": "f"}})
    chat = parsed.chat_body([{"role": "user", "content": "before"}])
    assert chat["messages"] == [{"role": "system", "content": "sys"},
                                {"role": "user", "content": "before"},
                                {"role": "user", "content": "q"}]
    assert chat["max_completion_tokens"] == 5 and chat["stream_options"]["include_usage"]
    assert chat["response_format"]["json_schema"]["name"] == "n"
    assert chat["tools"] == [{"type": "function", "function": {
        "name": "f", "parameters": {"type": "object"}}}]
    assert chat["tool_choice"] == {"type": "function", "function": {"name": "f"}}


def test_chat_refusals_take_the_callers_names():
    error = renamed(ApiError(400, "max_completion_tokens must be >= 1", "max_completion_tokens"),
                    RENAMES)
    assert (error.message, error.param) == ("max_output_tokens must be >= 1",
                                            "max_output_tokens")
    assert renamed(ApiError(400, "messages must be a list", "messages"), RENAMES).param == "input"


def test_anthropic_blocks_as_chat_messages():
    parsed = MessagesRequest.parse({
        "max_tokens": 3, "system": [{"type": "text", "text": "S", "cache_control": {}}],
        "stop_sequences": ["END"], "tool_choice": {"type": "any"},
        "tools": [{"name": "f", "input_schema": {"type": "object"}}],
        "messages": [
            {"role": "user", "content": "hi"},
            {"role": "assistant", "content": [
                {"type": "text", "text": "ok"},
                {"type": "tool_use", "id": "toolu_1", "name": "f", "input": {"a": 1}}]},
            {"role": "user", "content": [
                {"type": "tool_result", "tool_use_id": "toolu_1", "content": "r",
                 "is_error": True},
                {"type": "text", "text": "and?"}]}]})
    assert parsed.chat["messages"] == [
        {"role": "system", "content": "S"},
        {"role": "user", "content": "hi"},
        {"role": "assistant", "content": "ok", "tool_calls": [{
            "id": "toolu_1", "type": "function",
            "function": {"name": "f", "arguments": "{\"a\": 1}"}}]},
        {"role": "tool", "tool_call_id": "toolu_1", "content": "Error: r"},
        {"role": "user", "content": "and?"}]
    assert parsed.chat["tool_choice"] == "required" and parsed.chat["stop"] == ["END"]
    assert parsed.stop_sequences == ("END",)


def test_the_store_evicts_the_least_recently_used():
    store = ResponseStore(2)
    for name in ("a", "b"):
        store.put(Stored({"id": name}, []))
    assert store.get("a") is not None          # a is now the most recent
    store.put(Stored({"id": "c"}, []))
    assert store.get("b") is None and store.get("a") and store.get("c") and len(store) == 2
    assert store.delete("a") and not store.delete("a")
    none = ResponseStore(0)
    none.put(Stored({"id": "x"}, []))
    assert len(none) == 0


def _events(stream) -> list[tuple[str, dict]]:
    import asyncio
    import json

    async def read():
        return [line async for line in stream]

    out = []
    for line in asyncio.run(read()):
        kind, data = line.split("\n")[:2]
        out.append((kind.removeprefix("event: "), json.loads(data.removeprefix("data: "))))
    return out


async def _chunks(*chunks):
    for chunk in chunks:
        yield chunk


def _delta(**delta):
    return {"choices": [{"index": 0, "delta": delta, "logprobs": None, "finish_reason": None}]}


TEXT_THEN_CALL = (
    _delta(role="assistant", content=""), _delta(content="Hi"), _delta(content=" there"),
    _delta(tool_calls=[{"index": 0, "id": "call_1", "type": "function",
                        "function": {"name": "f", "arguments": "{\"a\""}}]),
    _delta(tool_calls=[{"index": 0, "function": {"arguments": ": 1}"}}]),
    {"choices": [{"index": 0, "delta": {}, "finish_reason": "tool_calls", "stop_reason": None}]},
    {"choices": [], "usage": {"prompt_tokens": 5, "completion_tokens": 7, "total_tokens": 12}})


def test_the_responses_stream_closes_text_before_a_call_and_counts_every_event():
    from folio.frontend.openai.responses.answer import ResponseHead
    from folio.frontend.openai.responses.stream import response_events

    kept = []
    events = _events(response_events(ResponseHead("m", {}), _chunks(*TEXT_THEN_CALL),
                                      kept.append))
    assert [kind for kind, _ in events] == [
        "response.created", "response.in_progress", "response.output_item.added",
        "response.content_part.added", "response.output_text.delta",
        "response.output_text.delta", "response.output_text.done",
        "response.content_part.done", "response.output_item.done",
        "response.output_item.added", "response.function_call_arguments.delta",
        "response.function_call_arguments.delta", "response.function_call_arguments.done",
        "response.output_item.done", "response.completed"]
    assert [data["sequence_number"] for _, data in events] == list(range(len(events)))
    (final,) = kept
    assert final == events[-1][1]["response"] and final["usage"]["output_tokens"] == 7
    assert [item["type"] for item in final["output"]] == ["message", "function_call"]
    assert final["output"][1]["arguments"] == "{\"a\": 1}"
    failed = _events(response_events(ResponseHead("m", {}), _chunks(
        _delta(content="x"), {"error": {"message": "gone", "code": "engine_unavailable"}}),
        kept.append))
    assert failed[-1][0] == "error" and failed[-1][1]["message"] == "gone" and len(kept) == 1


def test_the_messages_stream_names_blocks_and_the_stop_reason():
    from folio.frontend.anthropic.stream import message_events

    events = _events(message_events("m", 5, _chunks(*TEXT_THEN_CALL), ()))
    assert [kind for kind, _ in events] == [
        "message_start", "ping", "content_block_start", "content_block_delta",
        "content_block_delta", "content_block_stop", "content_block_start",
        "content_block_delta", "content_block_delta", "content_block_stop",
        "message_delta", "message_stop"]
    assert events[0][1]["message"]["usage"]["input_tokens"] == 5
    assert events[6][1]["content_block"] == {"type": "tool_use", "id": "toolu_1", "name": "f",
                                             "input": {}}
    assert events[-2][1]["delta"] == {"stop_reason": "tool_use", "stop_sequence": None}
    assert events[-2][1]["usage"] == {"output_tokens": 7}
    stopped = _events(message_events("m", 5, _chunks(_delta(content="ab"), {"choices": [{
        "index": 0, "delta": {}, "finish_reason": "stop", "stop_reason": "END"}]}), ("END",)))
    assert stopped[-2][1]["delta"] == {"stop_reason": "stop_sequence", "stop_sequence": "END"}
    failed = _events(message_events("m", 5, _chunks(
        {"error": {"message": "full", "code": "queue_full"}}), ()))
    assert failed[-1] == ("error", {"type": "error", "error": {
        "type": "overloaded_error", "message": "full"}})
