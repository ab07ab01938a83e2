"""Structured outputs through the official `openai` client against a real `folio serve` on a
random-weight model: whatever the weights, answers parse (strict json.loads) and validate,
regexes match, choices are one of the choices; bad specs are refused by name."""

from __future__ import annotations

import json
import re

import httpx
import jsonschema
import openai
import pytest
from pydantic import BaseModel, Field

from tests.frontend.openai.served import KEY, MODEL

pytestmark = pytest.mark.slow
MESSAGES = [{"role": "user", "content": "Describe a user as JSON."}]
# Nested objects, enums, arrays; strings and numbers bounded so that a random model's
# answer fits max_tokens (it fills free strings with whatever it likes).
SCHEMA = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "maxLength": 16},
        "role": {"enum": ["admin", "user", "guest"]},
        "age": {"type": "integer", "minimum": 0, "maximum": 120},
        "address": {"type": "object", "properties": {
            "city": {"type": "string", "maxLength": 12},
            "zip": {"type": "string", "pattern": "^[0-9]{5}$"}},
            "required": ["city", "zip"], "additionalProperties": False},
        "tags": {"type": "array", "items": {"type": "string", "maxLength": 8},
                 "minItems": 1, "maxItems": 3},
        "active": {"type": "boolean"},
    },
    "required": ["name", "role", "age", "address", "tags", "active"],
    "additionalProperties": False,
}
RESPONSE_FORMAT = {"type": "json_schema",
                   "json_schema": {"name": "user", "schema": SCHEMA, "strict": True}}


def _valid(text: str, schema: dict) -> dict:
    value = json.loads(text)   # strict: a raw control character in a string fails here
    jsonschema.validate(value, schema)
    return value


def test_json_schema_answers_validate_greedy_sampled_and_streamed(client):
    greedy = client.chat.completions.create(model=MODEL, messages=MESSAGES, max_tokens=200,
                                            temperature=0, response_format=RESPONSE_FORMAT)
    choice = greedy.choices[0]
    assert choice.finish_reason == "stop", choice
    _valid(choice.message.content, SCHEMA)
    again = client.chat.completions.create(model=MODEL, messages=MESSAGES, max_tokens=200,
                                           temperature=0, response_format=RESPONSE_FORMAT)
    assert again.choices[0].message.content == choice.message.content   # deterministic
    sampled = client.chat.completions.create(model=MODEL, messages=MESSAGES, max_tokens=200,
                                             temperature=1.0, n=3, seed=7,
                                             response_format=RESPONSE_FORMAT)
    for one in sampled.choices:
        assert one.finish_reason == "stop", one
        _valid(one.message.content, SCHEMA)
    stream = client.chat.completions.create(model=MODEL, messages=MESSAGES, max_tokens=200,
                                            temperature=1.0, seed=3, stream=True,
                                            response_format=RESPONSE_FORMAT)
    _valid("".join(chunk.choices[0].delta.content or "" for chunk in stream
                   if chunk.choices), SCHEMA)


class Address(BaseModel):
    city: str = Field(max_length=12)
    country: str = Field(max_length=12)


class Person(BaseModel):
    name: str = Field(max_length=16)
    kind: str = Field(pattern="^(cat|dog)$")
    address: Address
    scores: list[int] = Field(max_length=3)


def test_the_clients_parse_helper_gets_its_pydantic_model(client):
    parse = getattr(client.chat.completions, "parse", None) or \
        client.beta.chat.completions.parse
    completion = parse(model=MODEL, messages=MESSAGES, response_format=Person,
                       max_tokens=300, temperature=0.7, seed=1)
    person = completion.choices[0].message.parsed
    assert isinstance(person, Person) and person.kind in ("cat", "dog")
    assert isinstance(person.address, Address)


def test_json_object_regex_choice_and_grammar_on_both_routes(client):
    obj = client.chat.completions.create(model=MODEL, messages=MESSAGES, max_tokens=150,
                                         temperature=0,
                                         response_format={"type": "json_object"})
    # Any object: the model may stop mid-way at max_tokens, but what it gives is JSON.
    if obj.choices[0].finish_reason == "stop":
        assert isinstance(json.loads(obj.choices[0].message.content), dict)
    for body in ({"guided_json": SCHEMA}, {"structured_outputs": {"json": json.dumps(SCHEMA)}},
                 {"response_format": RESPONSE_FORMAT}):
        text = client.completions.create(model=MODEL, prompt="{", max_tokens=200,
                                         temperature=1.0, seed=8, extra_body=body)
        assert text.choices[0].finish_reason == "stop"
        _valid(text.choices[0].text, SCHEMA)
    regex = r"[a-z]{2,5}-[0-9]{3}"
    for body in ({"guided_regex": regex}, {"structured_outputs": {"regex": regex}}):
        text = client.completions.create(model=MODEL, prompt="id:", max_tokens=20,
                                         temperature=1.0, seed=2, n=2, extra_body=body)
        for one in text.choices:
            assert re.fullmatch(regex, one.text), one.text
    choices = ["red", "green", "light blue"]
    for body in ({"guided_choice": choices}, {"structured_outputs": {"choice": choices}}):
        chat = client.chat.completions.create(model=MODEL, messages=MESSAGES, max_tokens=10,
                                              temperature=1.0, n=4, seed=5,
                                              extra_body=body)
        assert all(c.message.content in choices for c in chat.choices)
    gbnf = 'root ::= "yes" | "no" | "n/a"'
    lark = 'start: ("ab" | "cd")+ "!"'
    yes = client.completions.create(model=MODEL, prompt="ok?", max_tokens=5, temperature=0,
                                    extra_body={"guided_grammar": gbnf})
    assert yes.choices[0].text in ("yes", "no", "n/a")
    abcd = client.completions.create(model=MODEL, prompt="ok?", max_tokens=30,
                                     temperature=1.0, seed=4,
                                     extra_body={"structured_outputs": {"grammar": lark}})
    text = abcd.choices[0].text
    assert re.fullmatch(r"(ab|cd)+!", text) or (abcd.choices[0].finish_reason == "length"
                                                 and re.fullmatch(r"(ab|cd)+", text)), text


def test_constrained_rows_leave_unconstrained_greedy_output_alone(client):
    plain = dict(model=MODEL, prompt="The list type", max_tokens=24, temperature=0)
    alone = client.completions.create(**plain).choices[0].text
    mixed = client.completions.create(
        model=MODEL, prompt=["The list type", "The list type"], max_tokens=24,
        temperature=0, extra_body={"guided_choice": ["a", "b"]})
    assert {c.text for c in mixed.choices} <= {"a", "b"}
    # The same prompt, unconstrained, batched with constrained ones: unchanged.
    import concurrent.futures

    with concurrent.futures.ThreadPoolExecutor(2) as pool:
        constrained = pool.submit(client.completions.create, model=MODEL,
                                  prompt="The list type", max_tokens=24, temperature=0,
                                  extra_body={"guided_regex": "[0-9]{20}"})
        together = pool.submit(client.completions.create, **plain)
        assert together.result().choices[0].text == alone
        assert re.fullmatch("[0-9]{20}", constrained.result().choices[0].text)


@pytest.mark.parametrize("route, extra, field, words", [
    ("chat", {"response_format": {"type": "json_schema", "json_schema": {
        "name": "x", "schema": {"type": "object", "properties": {"a": {"type": "strng"}}}}}},
     "response_format", "cannot be compiled"),
    ("chat", {"response_format": {"type": "json_schema", "json_schema": {
        "name": "x", "schema": {"type": "array", "minItems": 3, "maxItems": 1}}}},
     "response_format", "cannot be compiled"),
    ("chat", {"response_format": {"type": "json_schema", "json_schema": {
        "name": "x y", "schema": {}}}}, "response_format", "name"),
    ("chat", {"guided_json": "{not json"}, "guided_json", "not valid JSON"),
    ("completion", {"guided_regex": "(unclosed"}, "guided_regex", "cannot be compiled"),
    ("completion", {"guided_choice": "red"}, "guided_choice", "list"),
    ("completion", {"structured_outputs": {"regex": "a", "choice": ["b"]}},
     "structured_outputs", "exactly one"),
    ("completion", {"structured_outputs": {"whitespace_pattern": " *", "regex": "a"}},
     "structured_outputs", "not supported"),
    ("completion", {"guided_regex": "a", "guided_choice": ["b"]}, "guided_choice",
     "one structured output"),
    ("completion", {"guided_grammar": "start: nothere"}, "guided_grammar",
     "cannot be compiled"),
])
def test_bad_specs_are_refused_by_name(client, server, route, extra, field, words):
    path, base = (("/v1/chat/completions", {"messages": MESSAGES}) if route == "chat"
                  else ("/v1/completions", {"prompt": "x"}))
    response = httpx.post(f"{server.base}{path}", json={"model": MODEL, "max_tokens": 4,
                                                        **base, **extra},
                          headers={"Authorization": f"Bearer {KEY}"}, timeout=60)
    assert response.status_code == 400, response.text
    error = response.json()["error"]
    assert error["param"] == field and words in error["message"], error
    with pytest.raises(openai.BadRequestError):   # the client sees a plain 400 as well
        if route == "chat":
            client.chat.completions.create(model=MODEL, messages=MESSAGES, max_tokens=4,
                                           extra_body=extra)
        else:
            client.completions.create(model=MODEL, prompt="x", max_tokens=4,
                                      extra_body=extra)


def test_the_sdk_takes_a_structured_output_spec(server):
    from folio.client import Client
    from folio.errors import FolioError
    from folio.shared.sampling_params import SamplingParams

    with Client(server.zmq_address) as sdk:
        out = sdk.generate("A colour:", SamplingParams(
            max_tokens=8, temperature=1.0, seed=3,
            structured_output={"choice": ["red", "green"]}))
        assert out.text in ("red", "green")
        with pytest.raises(FolioError, match="cannot be compiled"):
            sdk.generate("x", SamplingParams(max_tokens=4,
                                             structured_output={"regex": "(open"}))


def test_offline_llm_constrained_greedy_survives_recompute_preemption(llama_dir, client):
    """folio.LLM steps serially; with a pool too small for the batch, requests are
    preempted and recomputed, and their matchers replay the output they already had:
    the answers are the ones an unpreempted run gives, and the ones `folio serve` gives
    with one step in flight (its executor feeds the matchers its own tokens)."""
    from folio import LLM
    from folio.shared.sampling_params import SamplingParams

    schema = {"type": "object", "properties": {
        "items": {"type": "array", "items": {"type": "integer", "minimum": 0,
                                             "maximum": 99}, "minItems": 8, "maxItems": 12},
        "note": {"type": "string", "maxLength": 30}},
        "required": ["items", "note"], "additionalProperties": False}
    params = SamplingParams(temperature=0, max_tokens=150, ignore_eos=False,
                            structured_output={"json": schema})
    prompts = [f"Record {i}:" for i in range(4)]
    roomy = LLM(str(llama_dir), num_kv_blocks=256, block_size=16)
    expected = [o.outputs[0].text for o in roomy.generate(prompts, params)]
    tight = LLM(str(llama_dir), num_kv_blocks=10, block_size=16,
                preemption_mode="recompute")
    got = [o.outputs[0].text for o in tight.generate(prompts, params)]
    assert tight.stats()["preemptions_recompute"] > 0
    assert got == expected
    served = client.completions.create(model=MODEL, prompt=prompts, max_tokens=150,
                                       temperature=0, extra_body={"guided_json": schema})
    assert [c.text for c in sorted(served.choices, key=lambda c: c.index)] == expected
    for text in got:
        _valid(text, schema)


def test_executor_masks_a_bad_grammar_down_to_eos_and_leaves_other_rows(llama_dir):
    import torch

    from folio.executor.structured_output import GrammarMasks
    from folio.executor.input_batch import CachedRequest
    from folio.executor.sampler import Sampler
    from folio.shared.sampling_params import SamplingParams
    from folio.shared.protocol.step import NewRequest, StepPlan

    vocab, eos = 1024, 0
    masks = GrammarMasks(str(llama_dir), vocab, (eos,))
    specs = [{"regex": "(unclosed"}, {"choice": ["yes", "no"]}, None]
    params = [SamplingParams(temperature=0, structured_output=s) for s in specs]
    masks.apply(StepPlan(step_id=0, new_requests=[
        NewRequest(h, [5, 6], 2, 0, 2, [0], p) for h, p in enumerate(params)]))
    requests = [CachedRequest(h, h, [5, 6], 2, 2, [0], p) for h, p in enumerate(params)]
    rows, mask = masks.start(requests).result()
    assert rows == [0, 1]
    logits = torch.randn(3, vocab)
    tokens = Sampler(torch.device("cpu"), 0, (eos,)).sample(logits.clone(), requests,
                                                             (rows, mask)).tokens
    assert tokens[0] == eos                             # no grammar here: only EOS is left
    assert tokens[2] == int(logits[2].argmax())         # the unconstrained row: untouched
    from transformers import AutoTokenizer

    text = AutoTokenizer.from_pretrained(llama_dir).decode([tokens[1]])
    assert "yes".startswith(text) or "no".startswith(text), text
    masks.close()
