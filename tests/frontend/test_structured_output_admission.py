"""Reliability IV (issue 25, items 4, 6 and 7): structured outputs cannot stall the service.

A grammar whose masks are costly (`a{100000}`: 22 characters, 25-50 ms of mask work per
token) is refused at admission, over HTTP and the SDK alike; one that gets past the frontend
(folio.LLM) fails alone in the executor once it costs past its budget. Grammars and tool schemas compile off
the event loop, after size checks. An empty language or a `$ref` cycle is refused instead
of answering "" with finish_reason "stop". Bystanders' outputs and /health are checked
under each attack; no timing is asserted.
"""

from __future__ import annotations

import asyncio
import json

import httpx
import pytest

from folio.frontend.structured_output_admission import GrammarAdmission
from folio.shared.structured_output import GrammarBudget
from tests.http_server import HttpServer

COSTLY = {"regex": "a{100000}"}
EMPTY = {"regex": r"[^\s\S]"}
CYCLE = {"json": {"$defs": {"a": {"$ref": "#/$defs/a"}}, "$ref": "#/$defs/a"}}
FINE = [{"regex": "[0-9]{20}"}, {"choice": ["red", "green"]}, {"json_object": True},
        {"json": {"type": "object", "properties": {"a": {"type": "integer"}},
                  "required": ["a"]}}]


@pytest.fixture(scope="module")
def admission(tokenizer_dir):
    from transformers import AutoTokenizer

    grammars = GrammarAdmission(AutoTokenizer.from_pretrained(str(tokenizer_dir)))
    yield grammars
    grammars.close()


def test_admission_refuses_costly_empty_and_cyclic_grammars(admission):
    async def verdicts():
        return [await admission.check([spec]) for spec in (COSTLY, EMPTY, CYCLE, *FINE)]

    costly, empty, cycle, *fine = asyncio.run(verdicts())
    assert "too costly" in costly
    assert "matches no output" in empty and "matches no output" in cycle
    assert fine == [None] * len(FINE)


def test_the_same_spec_is_admitted_once(admission):
    async def twice():
        return await asyncio.gather(admission.check([EMPTY]), admission.check([EMPTY]))

    assert asyncio.run(twice()) == [admission.verdicts[json.dumps([[EMPTY], True],
                                                                  sort_keys=True)]] * 2


def _masks_for(llama_dir, specs, budget=GrammarBudget()):
    from folio.executor.structured_output import GrammarMasks
    from folio.executor.input_batch import CachedRequest
    from folio.shared.sampling_params import SamplingParams
    from folio.shared.protocol.step import NewRequest, StepPlan

    masks = GrammarMasks(str(llama_dir), 1024, (0,), budget)
    params = [SamplingParams(temperature=0, structured_output=s) for s in specs]
    masks.apply(StepPlan(step_id=0, new_requests=[
        NewRequest(h, [5, 6], 2, 0, 2, [0], p) for h, p in enumerate(params)]))
    return masks, [CachedRequest(h, h, [5, 6], 2, 2, [0], p) for h, p in enumerate(params)]


def test_the_executor_fails_an_empty_language_alone(llama_dir):
    masks, requests = _masks_for(llama_dir, [EMPTY, {"choice": ["yes", "no"]}])
    rows, mask = masks.start(requests).result()
    failed = masks.take_failed(requests)
    assert list(failed) == [0] and "matches no output" in failed[0]
    assert bool(mask[1].any())   # the bystander's grammar still has its tokens
    masks.close()


def test_the_executor_fails_a_request_whose_masks_cost_past_the_budget(llama_dir):
    from folio.executor.structured_output import BUDGET_AFTER

    # A budget nothing meets: the constrained row fails once enough masks are timed.
    masks, requests = _masks_for(llama_dir, [{"regex": "[a-z]{200}"}],
                                 GrammarBudget(max_mask_ms=-1.0))
    failed: dict[int, str] = {}
    for _ in range(BUDGET_AFTER + 2):
        rows, mask = masks.start(requests).result()
        failed = masks.take_failed(requests)
        if failed:
            break
        allowed = [t for t in range(1024) if (int(mask[0, t // 32]) >> (t % 32)) & 1]
        masks.accepted(requests, [allowed[0]])
    assert list(failed) == [0] and "over the budget" in failed[0]
    masks.close()


# ---- against a served model ------------------------------------------------------------------

@pytest.fixture(scope="module")
def server(tmp_path_factory, llama_dir):
    srv = HttpServer(llama_dir, tmp_path_factory.mktemp("rel4g"), "--num-kv-blocks", "512",
                     "--tool-call-parser", "hermes", "--served-model-name", "m")
    try:
        srv.wait_ready()
        yield srv
    finally:
        srv.stop()


BYSTANDER = {"model": "m", "prompt": "The while statement", "max_tokens": 24,
             "temperature": 0, "ignore_eos": True}


def _post(server, path: str, body: dict) -> httpx.Response:
    return httpx.post(f"{server.base}{path}", json=body, timeout=120)


@pytest.mark.slow
@pytest.mark.parametrize("extra, field, words", [
    ({"structured_outputs": COSTLY}, "structured_outputs", "too costly"),
    ({"guided_regex": EMPTY["regex"]}, "guided_regex", "matches no output"),
    ({"response_format": {"type": "json_schema", "json_schema": {
        "name": "x", "schema": CYCLE["json"]}}}, "response_format", "matches no output"),
    ({"response_format": {"type": "json_schema", "json_schema": {
        "name": "x", "schema": {"$ref": "#"}}}}, "response_format", "matches no output"),
])
def test_costly_and_empty_grammars_are_refused_by_name(server, extra, field, words):
    response = _post(server, "/v1/chat/completions", {
        "model": "m", "messages": [{"role": "user", "content": "x"}], "max_tokens": 4,
        **extra})
    assert response.status_code == 400, response.text
    error = response.json()["error"]
    assert error["param"] == field and words in error["message"], error


def _tools(count: int, padding: int) -> list[dict]:
    return [{"type": "function", "function": {
        "name": f"tool_{i}", "description": "x" * padding, "parameters": {
            "type": "object", "properties": {f"p{j}": {"type": "string", "maxLength": 8}
                                             for j in range(6)}}}} for i in range(count)]


@pytest.mark.slow
def test_oversized_tool_lists_are_refused_before_compiling(server):
    response = _post(server, "/v1/chat/completions", {
        "model": "m", "messages": [{"role": "user", "content": "x"}], "max_tokens": 4,
        "tools": _tools(128, 30_000)})   # 3.8 MiB, as in the issue
    assert response.status_code == 400, response.text
    error = response.json()["error"]
    assert error["param"] == "tools" and "characters in all" in error["message"], error


@pytest.mark.slow
def test_bystanders_and_health_are_served_under_grammar_attacks(server):
    expected = _post(server, "/v1/completions", BYSTANDER).json()["choices"][0]["text"]
    chat = {"model": "m", "messages": [{"role": "user", "content": "x"}], "max_tokens": 4}

    async def attack(client: httpx.AsyncClient, i: int) -> int:
        kind = i % 3
        if kind == 0:    # the costly regex, a distinct spec each time (no cached verdict)
            body = {**chat, "structured_outputs": {"regex": f"b{{{i}}}a{{100000}}"}}
        elif kind == 1:  # many tools just under the size cap, compiled each time
            tools = _tools(128, 1_400)
            tools[0]["function"]["description"] += str(i)
            tools[0]["function"]["parameters"]["properties"][f"q{i}"] = {"type": "integer"}
            body = {**chat, "tools": tools}   # auto: each schema compiled at admission
        else:            # an empty language
            body = {**chat, "guided_regex": rf"{i}[^\s\S]"}
        response = await client.post(f"{server.base}/v1/chat/completions", json=body)
        return response.status_code

    async def run():
        async with httpx.AsyncClient(timeout=120) as client:
            attacks = [asyncio.create_task(attack(client, i)) for i in range(9)]
            bystanders = [asyncio.create_task(client.post(
                f"{server.base}/v1/completions", json=BYSTANDER)) for _ in range(4)]
            health = []
            while not all(task.done() for task in attacks):   # bounded by the attacks' own
                health.append((await client.get(f"{server.base}/health")).status_code)
                await asyncio.sleep(0.05)
            return (await asyncio.gather(*attacks), await asyncio.gather(*bystanders),
                    health)

    codes, bystanders, health = asyncio.run(run())
    assert [c for i, c in enumerate(codes) if i % 3 != 1] == [400] * 6
    assert all(code in (200, 400) for code in codes)   # tools: served or refused by name
    assert [r.json()["choices"][0]["text"] for r in bystanders] == [expected] * 4
    assert health and set(health) == {200}


@pytest.mark.slow
def test_the_sdk_gateway_admits_grammars_like_http(server):
    """The SDK's gateway admits a grammar as the HTTP API does (off the loop, within the
    budget): costly and empty grammars are refused by name, and a bystander runs on."""
    from folio.client import Client
    from folio.errors import FolioError
    from folio.shared.sampling_params import SamplingParams

    expected = _post(server, "/v1/completions", BYSTANDER).json()["choices"][0]["text"]
    with Client(server.zmq_address) as sdk:
        with pytest.raises(FolioError, match="structured_output: the grammar is too costly"):
            sdk.generate("x", SamplingParams(max_tokens=16, temperature=0,
                                             structured_output=COSTLY))
        with pytest.raises(FolioError, match="structured_output: .*matches no output"):
            sdk.generate("x", SamplingParams(max_tokens=16, structured_output=EMPTY))
        out = sdk.generate("A colour:", SamplingParams(
            max_tokens=8, temperature=0, structured_output={"choice": ["red", "green"]}))
        assert out.text in ("red", "green")
    assert _post(server, "/v1/completions", BYSTANDER).json()["choices"][0]["text"] == expected
