"""Tool calling through the official `openai` client against a real `folio serve
--tool-call-parser hermes`, with a Hermes/Qwen-style chat template that renders tools, on
a random-weight model: `required` and named calls always come back valid (the grammar);
`auto` is parsed from what the model writes (elicited here with a regex, since a random
model would not write a call by itself); the round trip with tool results works. The
parsers themselves are checked without a server."""

from __future__ import annotations

import json
import re

import jsonschema
import pytest

from folio.frontend.openai.tool_calls import ToolPlan
from folio.frontend.openai.tool_parsers import parse_hermes, parse_llama3_json, stream_holdback
from tests.http_server import openai_client, serving, with_chat_template

KEY = "sk-tools"
MODEL = "tiny"
WEATHER = {"type": "object", "properties": {
    "city": {"type": "string", "maxLength": 12},
    "unit": {"enum": ["celsius", "fahrenheit"]},
    "days": {"type": "integer", "minimum": 1, "maximum": 7}},
    "required": ["city", "unit", "days"], "additionalProperties": False}
TIME = {"type": "object", "properties": {"zone": {"enum": ["UTC", "CET", "PST"]}},
        "required": ["zone"], "additionalProperties": False}
TOOLS = [{"type": "function", "function": {"name": "get_weather",
                                           "description": "Weather forecast for a city",
                                           "parameters": WEATHER}},
         {"type": "function", "function": {"name": "get_time", "parameters": TIME}}]
SCHEMAS = {"get_weather": WEATHER, "get_time": TIME}
MESSAGES = [{"role": "user", "content": "What is the weather in Paris?"}]
# Hermes / Qwen 2.5 style: tools in the system turn, calls and results as tagged JSON.
TEMPLATE = """{%- if tools %}<|im_start|>system
You may call one or more functions. Their signatures:
<tools>
{% for tool in tools %}{{ tool | tojson }}
{% endfor %}</tools>
Answer with <tool_call>{"name": <name>, "arguments": <object>}</tool_call>.<|im_end|>
{% endif %}
{%- for message in messages %}
{%- if message.role == "tool" %}<|im_start|>tool
<tool_response>{{ message.content }}</tool_response><|im_end|>
{% elif message.tool_calls %}<|im_start|>assistant
{% for call in message.tool_calls %}<tool_call>{"name": "{{ call.function.name }}", \
"arguments": {{ call.function.arguments | tojson }}}</tool_call>{% endfor %}<|im_end|>
{% else %}<|im_start|>{{ message.role }}
{{ message.content }}<|im_end|>
{% endif %}
{%- endfor %}
{%- if add_generation_prompt %}<|im_start|>assistant
{% endif %}"""


@pytest.fixture(scope="module")
def tools_model_dir(tmp_path_factory, llama_dir):
    return with_chat_template(llama_dir, tmp_path_factory.mktemp("tools-model"), TEMPLATE)


@pytest.fixture(scope="module")
def client(tmp_path_factory, tools_model_dir):
    with serving(tools_model_dir, tmp_path_factory.mktemp("tools"), "--api-key", KEY,
                 "--served-model-name", MODEL, "--num-kv-blocks", "256",
                 "--tool-call-parser", "hermes") as srv:
        yield openai_client(srv, KEY)


def _check_call(call) -> dict:
    assert call.type == "function" and call.id.startswith("call_")
    arguments = json.loads(call.function.arguments)
    jsonschema.validate(arguments, SCHEMAS[call.function.name])
    return arguments


@pytest.mark.slow
def test_required_and_named_calls_are_always_valid(client):
    required = client.chat.completions.create(
        model=MODEL, messages=MESSAGES, tools=TOOLS, tool_choice="required",
        parallel_tool_calls=False, max_tokens=120, temperature=1.0, n=3, seed=11)
    for choice in required.choices:
        assert choice.finish_reason == "tool_calls", choice
        assert choice.message.content is None and len(choice.message.tool_calls) == 1
        _check_call(choice.message.tool_calls[0])
    named = client.chat.completions.create(
        model=MODEL, messages=MESSAGES, tools=TOOLS, max_tokens=120, temperature=0,
        tool_choice={"type": "function", "function": {"name": "get_weather"}})
    (call,) = named.choices[0].message.tool_calls
    assert call.function.name == "get_weather" and named.choices[0].finish_reason == "stop"
    _check_call(call)
    # LangChain's schema of a pydantic tool: no additionalProperties. Unlisted keys are
    # closed off (as xgrammar's strict mode does), so the call ends with the listed ones.
    open_schema = {"type": "object", "required": ["zone"], "properties": {
        "zone": {"enum": ["UTC", "CET"], "type": "string"}}}
    langchain_tool = [{"type": "function", "function": {"name": "Clock", "description": "",
                                                        "parameters": open_schema}}]
    clock = client.chat.completions.create(
        model=MODEL, messages=MESSAGES, tools=langchain_tool, max_tokens=60, temperature=0,
        tool_choice={"type": "function", "function": {"name": "Clock"}})
    assert clock.choices[0].finish_reason == "stop"
    assert json.loads(clock.choices[0].message.tool_calls[0].function.arguments) in (
        {"zone": "UTC"}, {"zone": "CET"})


def _accumulated(stream) -> tuple[str, dict[int, dict], str | None]:
    """(content, calls by index with their argument pieces, finish_reason) of a stream,
    checking OpenAI's shape: a call's first delta carries id, type and name (arguments
    ""), the later ones argument pieces only."""
    content, calls, finish = "", {}, None
    for chunk in stream:
        delta = chunk.choices[0].delta
        content += delta.content or ""
        for part in delta.tool_calls or []:
            if part.index not in calls:
                assert part.id.startswith("call_") and part.type == "function"
                assert part.function.name and part.function.arguments == ""
                calls[part.index] = {"name": part.function.name, "pieces": []}
            else:
                assert part.id is None and part.function.name is None
                calls[part.index]["pieces"].append(part.function.arguments)
        finish = chunk.choices[0].finish_reason or finish
    return content, calls, finish


@pytest.mark.slow
def test_streamed_calls_arrive_as_tool_call_deltas(client):
    for choice in ("required", {"type": "function", "function": {"name": "get_time"}}):
        request = dict(model=MODEL, messages=MESSAGES, tools=TOOLS, tool_choice=choice,
                       max_tokens=200, temperature=1.0, seed=5)
        whole = client.chat.completions.create(**request).choices[0].message.tool_calls
        content, calls, finish = _accumulated(
            client.chat.completions.create(**request, stream=True))
        assert not content   # calls only: no text streams as content
        assert calls and finish in ("tool_calls", "stop")
        # The arguments stream in pieces as they are generated, and the pieces make the
        # non-streamed answer's arguments exactly.
        assert [(c["name"], "".join(c["pieces"])) for _, c in sorted(calls.items())] == \
            [(c.function.name, c.function.arguments) for c in whole]
        assert all(len(c["pieces"]) > 1 for c in calls.values())
        if choice != "required":
            assert calls[0]["name"] == "get_time"
        for entry in calls.values():
            jsonschema.validate(json.loads("".join(entry["pieces"])), SCHEMAS[entry["name"]])


@pytest.mark.slow
def test_auto_parses_a_hermes_call_the_model_writes_streamed_and_not(client):
    # The regex stands in for a model trained to call tools: the text is the model's.
    written = ('Let me check. <tool_call>{"name": "get_weather", "arguments": '
               '{"city": "Paris", "unit": "celsius", "days": 2}}</tool_call>')
    extra = {"guided_regex": re.escape(written)}
    answer = client.chat.completions.create(model=MODEL, messages=MESSAGES, tools=TOOLS,
                                            max_tokens=120, temperature=0, extra_body=extra)
    message = answer.choices[0].message
    assert answer.choices[0].finish_reason == "tool_calls"
    assert message.content == "Let me check."
    (call,) = message.tool_calls
    assert call.function.name == "get_weather"
    assert _check_call(call) == {"city": "Paris", "unit": "celsius", "days": 2}
    stream = client.chat.completions.create(model=MODEL, messages=MESSAGES, tools=TOOLS,
                                            max_tokens=120, temperature=0, stream=True,
                                            extra_body=extra)
    content, calls, finish = _accumulated(stream)
    assert content.strip() == "Let me check." and "<tool_call" not in content
    assert finish == "tool_calls" and [c["name"] for c in calls.values()] == ["get_weather"]
    assert len(calls[0]["pieces"]) > 3   # in pieces as written, not whole at the end
    assert "".join(calls[0]["pieces"]) == call.function.arguments
    # The openai client's stream helper sees the same pieces and the same final call.
    with client.chat.completions.stream(model=MODEL, messages=MESSAGES, tools=TOOLS,
                                        max_tokens=120, temperature=0,
                                        extra_body=extra) as helper:
        deltas = [event.arguments_delta for event in helper
                  if event.type == "tool_calls.function.arguments.delta"]
        final = helper.get_final_completion().choices[0].message.tool_calls[0]
    assert len(deltas) > 3 and "".join(deltas) == call.function.arguments
    assert (final.function.name, final.function.arguments) == \
        ("get_weather", call.function.arguments)
    # Plain text under auto stays content, with no tool_calls.
    plain = client.chat.completions.create(model=MODEL, messages=MESSAGES, tools=TOOLS,
                                           max_tokens=8, temperature=0,
                                           extra_body={"guided_regex": "[a-z ]{3,20}"})
    assert plain.choices[0].message.tool_calls is None
    assert re.fullmatch("[a-z ]{3,20}", plain.choices[0].message.content)


@pytest.mark.slow
def test_the_round_trip_with_tool_results(client):
    first = client.chat.completions.create(
        model=MODEL, messages=MESSAGES, tools=TOOLS, tool_choice="required",
        parallel_tool_calls=False, max_tokens=120, temperature=0)
    message = first.choices[0].message
    (call,) = message.tool_calls
    history = [*MESSAGES, message.model_dump(exclude_none=True),
               {"role": "tool", "tool_call_id": call.id, "content": "sunny, 21 C"}]
    second = client.chat.completions.create(model=MODEL, messages=history, tools=TOOLS,
                                            tool_choice="none", max_tokens=5, temperature=0)
    assert second.choices[0].message.tool_calls is None
    # The call and its result were rendered into the prompt (none: tools are not).
    alone = client.chat.completions.create(model=MODEL, messages=MESSAGES, tools=TOOLS,
                                           tool_choice="none", max_tokens=1)
    assert second.usage.prompt_tokens > alone.usage.prompt_tokens + 10


@pytest.mark.slow
def test_tool_requests_are_refused_by_name(client):
    import openai

    cases = [({"tools": TOOLS, "tool_choice": {"type": "function",
                                                "function": {"name": "nope"}}},
              "tool_choice", "not in tools"),
             ({"tools": [{"type": "function", "function": {"name": "bad name"}}]},
              "tools", "function.name"),
             ({"tools": [{"type": "function", "function": {
                 "name": "f", "parameters": {"type": "object", "properties": {
                     "a": {"type": "strng"}}}}}]}, "tools", "cannot be compiled"),
             ({"tools": TOOLS, "tool_choice": "required",
               "response_format": {"type": "json_object"}}, "response_format",
              "already constrains")]
    for extra, param, words in cases:
        with pytest.raises(openai.BadRequestError) as caught:
            client.chat.completions.create(model=MODEL, messages=MESSAGES, max_tokens=4,
                                           extra_body=extra)
        error = caught.value.body
        assert error["param"] == param and words in error["message"], error


# ---- the parsers, without a server -------------------------------------------------------

def test_hermes_parser():
    text = ('Sure. <tool_call>\n{"name": "a", "arguments": {"x": 1}}\n</tool_call>\n'
            '<tool_call>{"name": "b", "arguments": "{\\"y\\": 2}"}</tool_call>')
    assert parse_hermes(text) == ("Sure.", [("a", '{"x": 1}'), ("b", '{"y": 2}')])
    # Cut off before the closing tag (stopped at EOS): still a call.
    assert parse_hermes('<tool_call>{"name": "a", "arguments": {}}') == (None, [("a", "{}")])
    assert parse_hermes("no calls here") == ("no calls here", [])
    broken = "<tool_call>{not json}</tool_call>"
    assert parse_hermes(broken) == (broken, [])
    assert stream_holdback("hermes", "Hello <tool") == len("Hello ")
    assert stream_holdback("hermes", "Hello <tool_call>{") == len("Hello ")
    assert stream_holdback("hermes", "a < b") == len("a < b")


def test_llama3_json_parser():
    assert parse_llama3_json('{"name": "a", "parameters": {"x": 1}}') == \
        (None, [("a", '{"x": 1}')])
    assert parse_llama3_json('<|python_tag|>{"name": "a", "parameters": {}}; '
                             '{"name": "b", "arguments": {"y": [1]}}') == \
        (None, [("a", "{}"), ("b", '{"y": [1]}')])
    assert parse_llama3_json("It is sunny.") == ("It is sunny.", [])
    assert parse_llama3_json('{"name": "a", "parameters": {') == \
        ('{"name": "a", "parameters": {', [])
    assert stream_holdback("llama3_json", ' {"na') == 0
    assert stream_holdback("llama3_json", "It is") == len("It is")


def test_auto_keeps_one_call_without_parallel_tool_calls():
    plan = ToolPlan("auto", [], None, parser="hermes", parallel=False)
    text = '<tool_call>{"name": "a", "arguments": {}}</tool_call>' * 2
    assert plan.read(text) == (None, [("a", "{}")])


def test_required_answer_cut_short_keeps_its_complete_calls():
    plan = ToolPlan("required", [], {"json": {}})
    text = '[{"name": "a", "parameters": {"x": 1}},{"name": "b", "parameters": {"y'
    assert plan.read(text) == (None, [("a", '{"x": 1}')])
    assert plan.read('[{"name": "a", "param') == ('[{"name": "a", "param', [])
