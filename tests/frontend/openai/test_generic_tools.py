"""Tools on a model whose chat template does not render them: the frontend writes them into
the system message and the grammar holds the answer to the generic format
(frontend/openai/generic_tools.py). Served for real with SmolLM2-135M-Instruct's own chat template
(it ignores `tools`) on the tiny random model, through the official `openai` client."""

from __future__ import annotations

import json

import jsonschema
import pytest

from folio.frontend.openai.generic_tools import parse_auto, renders_tools, with_tools
from folio.frontend.openai.tool_calls import tool_plan
from folio.shared.hf_tokenizer import load_tokenizer
from tests.http_server import openai_client, serving, with_chat_template

KEY = "sk-generic"
MODEL = "smol-template"
# SmolLM2-135M-Instruct's chat_template.jinja, as the model ships it (Apache-2.0).
SMOLLM2_TEMPLATE = (
    "{% for message in messages %}{% if loop.first and messages[0]['role'] != 'system' %}"
    "{{ '<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging "
    "Face<|im_end|>\n' }}{% endif %}{{'<|im_start|>' + message['role'] + '\n' + "
    "message['content'] + '<|im_end|>' + '\n'}}{% endfor %}{% if add_generation_prompt %}"
    "{{ '<|im_start|>assistant\n' }}{% endif %}")
WEATHER = {"type": "object", "properties": {
    "city": {"type": "string", "maxLength": 12},
    "unit": {"enum": ["celsius", "fahrenheit"]}},
    "required": ["city", "unit"], "additionalProperties": False}
TIME = {"type": "object", "properties": {"zone": {"enum": ["UTC", "CET"]}},
        "required": ["zone"], "additionalProperties": False}
TOOLS = [{"type": "function", "function": {"name": "get_weather",
                                           "description": "Weather forecast for a city",
                                           "parameters": WEATHER}},
         {"type": "function", "function": {"name": "get_time", "parameters": TIME}}]
SCHEMAS = {"get_weather": WEATHER, "get_time": TIME}
MESSAGES = [{"role": "user", "content": "What is the weather in Paris?"}]


@pytest.fixture(scope="module")
def smol_template_dir(tmp_path_factory, llama_dir):
    return with_chat_template(llama_dir, tmp_path_factory.mktemp("smol-template"), SMOLLM2_TEMPLATE)


@pytest.fixture(scope="module")
def client(tmp_path_factory, smol_template_dir):
    # No --tool-call-parser: the generic format needs none.
    with serving(smol_template_dir, tmp_path_factory.mktemp("generic"), "--api-key", KEY,
                 "--served-model-name", MODEL, "--num-kv-blocks", "256") as srv:
        yield openai_client(srv, KEY)


def _valid(call) -> dict:
    arguments = json.loads(call.function.arguments)
    jsonschema.validate(arguments, SCHEMAS[call.function.name])
    return arguments


def test_the_template_ignores_tools_and_the_prompt_carries_them(smol_template_dir, llama_dir):
    tokenizer = load_tokenizer(smol_template_dir)
    assert not renders_tools(tokenizer)
    plan = tool_plan({"tools": TOOLS, "tool_choice": "auto"}, None, renders_tools=False)
    prompt = tokenizer.apply_chat_template(plan.messages(MESSAGES), tools=plan.template_tools,
                                           add_generation_prompt=True, tokenize=False)
    # One system turn (SmolLM2's default one replaced), the tools and the format in it.
    assert prompt.count("<|im_start|>system") == 1 and "SmolLM" not in prompt
    assert '"name": "get_weather"' in prompt and '"maxLength": 12' in prompt
    assert '{"response": ' in prompt and prompt.endswith("<|im_start|>assistant\n")


def test_auto_answers_are_words_or_valid_calls(client):
    answer = client.chat.completions.create(model=MODEL, messages=MESSAGES, tools=TOOLS,
                                            max_tokens=200, temperature=1.0, n=6, seed=3)
    kinds = set()
    for choice in answer.choices:
        if choice.message.tool_calls:
            assert choice.finish_reason == "tool_calls" and choice.message.content is None
            for call in choice.message.tool_calls:
                _valid(call)
            kinds.add("calls")
        elif choice.finish_reason == "stop":
            assert isinstance(choice.message.content, str)   # {"response": ...}, unwrapped
            assert not choice.message.content.startswith('{"response"')
            kinds.add("words")
    assert kinds, "every answer ran out of tokens"
    # Streamed, the same answers: calls in argument pieces, words as content (an answer
    # cut short by max_tokens is not a call unstreamed, while its pieces went out).
    stream = client.chat.completions.create(model=MODEL, messages=MESSAGES, tools=TOOLS,
                                            max_tokens=200, temperature=1.0, n=6, seed=3,
                                            stream=True)
    content: dict[int, str] = {}
    calls: dict[int, dict[int, list]] = {}
    for chunk in stream:
        for choice in chunk.choices:
            content[choice.index] = content.get(choice.index, "") + (choice.delta.content or "")
            for part in choice.delta.tool_calls or []:
                pieces = calls.setdefault(choice.index, {}).setdefault(part.index, [])
                pieces.append(part.function.name or part.function.arguments)
    ended = [choice for choice in answer.choices if choice.finish_reason != "length"]
    for choice in ended:
        whole = [(c.function.name, c.function.arguments)
                 for c in choice.message.tool_calls or []]
        streamed = [(p[0], "".join(p[1:])) for _, p in
                    sorted(calls.get(choice.index, {}).items())]
        assert streamed == whole
        assert all(len(p) > 2 for p in calls.get(choice.index, {}).values())
        if not whole:
            assert content[choice.index] == choice.message.content
    # The tools are in the prompt: it is longer than the same chat without them.
    plain = client.chat.completions.create(model=MODEL, messages=MESSAGES, max_tokens=1)
    assert answer.usage.prompt_tokens > plain.usage.prompt_tokens + 50


def test_required_and_named_calls_are_valid_streamed_and_not(client):
    required = client.chat.completions.create(
        model=MODEL, messages=MESSAGES, tools=TOOLS, tool_choice="required",
        parallel_tool_calls=False, max_tokens=120, temperature=1.0, n=3, seed=11)
    for choice in required.choices:
        assert choice.finish_reason == "tool_calls", choice
        (call,) = choice.message.tool_calls
        _valid(call)
    stream = client.chat.completions.create(
        model=MODEL, messages=MESSAGES, tools=TOOLS, max_tokens=120, temperature=0,
        tool_choice={"type": "function", "function": {"name": "get_time"}}, stream=True)
    name, arguments = None, ""
    for chunk in stream:
        for delta_call in (chunk.choices[0].delta.tool_calls or []) if chunk.choices else []:
            name = delta_call.function.name or name
            arguments += delta_call.function.arguments or ""
    assert name == "get_time" and json.loads(arguments)["zone"] in ("UTC", "CET")


def test_the_round_trip_renders_calls_and_results_as_text(client):
    first = client.chat.completions.create(
        model=MODEL, messages=MESSAGES, tools=TOOLS, tool_choice="required",
        parallel_tool_calls=False, max_tokens=120, temperature=0)
    message = first.choices[0].message
    (call,) = message.tool_calls
    history = [*MESSAGES, message.model_dump(exclude_none=True),
               {"role": "tool", "tool_call_id": call.id, "content": "sunny, 21 C"}]
    second = client.chat.completions.create(model=MODEL, messages=history, tools=TOOLS,
                                            max_tokens=40, temperature=0)
    assert second.choices[0].finish_reason in ("stop", "tool_calls", "length")
    assert second.usage.prompt_tokens > first.usage.prompt_tokens + 10


def test_with_tools_rewrites_calls_and_results_for_a_plain_template():
    history = [{"role": "system", "content": "Be brief."}, *MESSAGES,
               {"role": "assistant", "content": "", "tool_calls": [
                   {"id": "call_1", "type": "function",
                    "function": {"name": "get_time", "arguments": {"zone": "UTC"}}}]},
               {"role": "tool", "tool_call_id": "call_1", "content": "12:00"}]
    system, user, assistant, result = with_tools(history, TOOLS, "auto", None)
    assert system["content"].startswith("Be brief.\n\nYou can call these tools")
    assert user == MESSAGES[0]
    assert json.loads(assistant["content"]) == \
        {"tool_calls": [{"name": "get_time", "arguments": {"zone": "UTC"}}]}
    assert "tool_calls" not in assistant
    assert result == {"role": "user", "content": "Result of get_time: 12:00"}


def test_parse_auto_reads_both_shapes_and_leaves_anything_else_as_text():
    assert parse_auto('{"response": "It is sunny."}') == ("It is sunny.", [])
    assert parse_auto('{"tool_calls": [{"name": "a", "arguments": {"x": 1}}]}') == \
        (None, [("a", '{"x": 1}')])
    assert parse_auto('{"tool_calls": [{"name": "a", "argu') == \
        ('{"tool_calls": [{"name": "a", "argu', [])
