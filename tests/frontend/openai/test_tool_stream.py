"""Streamed tool calls without a server: answers fed to the chat stream's ToolStream in
pieces of every size give the non-streamed reading (ToolPlan.read) exactly: the same
content, the same calls, each call's argument pieces concatenating to its arguments,
the first entry of a call carrying id, type and name with arguments ""."""

from __future__ import annotations

import json
import random

import pytest

from folio.frontend.openai.tool_calls import ToolPlan
from folio.frontend.openai.tool_stream.answer_stream import ToolStream
from folio.frontend.openai.tool_stream.json_events import JsonLexer, JsonWriter

HERMES = ToolPlan("auto", [], None, parser="hermes")
LLAMA3 = ToolPlan("auto", [], None, parser="llama3_json")
REQUIRED = ToolPlan("required", [], {"json": {}})
GENERIC = ToolPlan("auto", [], {"json": {}}, generic=True)
NAMED = ToolPlan("named", [], {"json": {}}, named="get_time")

CASES = [
    (HERMES, 'Let me check. <tool_call>{"name": "get_weather", "arguments": {"city": '
             '"Paris", "unit": "celsius", "days": 2}}</tool_call>'),
    (HERMES, 'Sure. <tool_call>\n{"name": "a", "arguments": {"x": 1}}\n</tool_call>\n'
             '<tool_call>{"name": "b", "arguments": "{\\"y\\": 2}"}</tool_call>'),
    (HERMES, '<tool_call>{"arguments": {"q": [1, 2.50, "\\u00e9\\n"]}, "name": "late"}'
             '</tool_call>'),
    (HERMES, '<tool_call>{"name": "none"}</tool_call>'),
    (HERMES, "a < b, and <tool no call here"),
    (LLAMA3, '<|python_tag|>{"name": "a", "parameters": {"x":1,"y":{"z":[true,null]}}}; '
             '{"name": "b", "arguments": {}}'),
    (LLAMA3, "It is sunny."),
    (REQUIRED, '[{"name":"get_time","parameters":{"zone":"UTC"}},{"name":"get_weather",'
               '"parameters":{"city":"Oslo","unit":"celsius","days":3}}]'),
    (GENERIC, '{"tool_calls":[{"name":"get_time","arguments":{"zone":"CET"}}]}'),
    (GENERIC, '{"response":"Hello there"}'),
    (NAMED, '{"zone":"UTC"}'),
]


def _streamed(plan: ToolPlan, text: str, rng: random.Random):
    stream, content, calls = ToolStream(plan), "", {}
    at = 0
    pieces = []
    while at < len(text):
        size = rng.randint(1, 6)
        pieces.append(text[at:at + size])
        at += size
    outs = [stream.feed(piece) for piece in pieces]
    rest, entries, called = stream.finish()
    outs.append((rest, entries))
    for out_content, out_entries in outs:
        content += out_content
        for entry in out_entries:
            if entry["index"] not in calls:   # a call's first entry
                assert entry["id"].startswith("call_") and entry["type"] == "function"
                assert entry["function"]["arguments"] == ""
                calls[entry["index"]] = {"name": entry["function"]["name"], "arguments": ""}
            else:
                assert set(entry) == {"index", "function"}
            calls[entry["index"]]["arguments"] += entry["function"]["arguments"]
    return content, calls, called


@pytest.mark.parametrize("plan, text", CASES)
def test_pieces_of_any_size_give_the_whole_reading(plan, text):
    content, calls = plan.read(text)
    rng = random.Random(7)
    for _ in range(25):
        got_content, got_calls, called = _streamed(plan, text, rng)
        assert called == bool(calls)
        assert [(c["name"], c["arguments"]) for _, c in sorted(got_calls.items())] == calls
        if calls:
            assert got_content.strip() == (content or "")
        else:
            assert got_content == content


def test_arguments_stream_before_the_answer_ends():
    text = CASES[0][1]
    stream, pieces = ToolStream(HERMES), []
    for char in text[:-len('}}</tool_call>')]:
        for entry in stream.feed(char)[1]:
            pieces.append(entry["function"]["arguments"])
    assert pieces[0] == "" and len([p for p in pieces if p]) > 3
    # "2" is not final until what follows it shows the number ended
    assert "".join(pieces) == '{"city": "Paris", "unit": "celsius", "days": '


def test_the_writer_writes_what_json_dumps_writes():
    texts = ['{ "a" :1 ,"b":[ ], "c":{}}', '[1, 2.50, -0, 1E5, true, null, "x\\ny"]',
             '{"s": "caf\\u00e9 \\ud83d\\ude00 \\/ \\t"}', '{"n": {"m": [[], [{}], "q"]}}']
    rng = random.Random(3)
    for text in texts:
        lexer, writer, out, at = JsonLexer(), JsonWriter(0), "", 0
        while at < len(text):
            size = rng.randint(1, 3)
            out += "".join(writer.write(e) for e in lexer.feed(text[at:at + size]))
            at += size
        assert lexer.done and out == json.dumps(json.loads(text), ensure_ascii=False)
    broken = JsonLexer()
    broken.feed('{"a": 1,]')
    assert broken.failed
