"""The typed OpenAI requests: a body is parsed once into what the rest of the HTTP path
reads (the engine's SamplingParams included), or refused naming the field. No server here:
tests/frontend/openai/test_route_fields.py checks the same refusals over HTTP."""

from __future__ import annotations

import pytest

from folio.frontend.openai.errors import ApiError
from folio.frontend.openai.requests import (ChatRequest, CompletionRequest, DetokenizeRequest,
                                            ServerTerms, TokenizeRequest)

TERMS = ServerTerms(max_logprobs=5, tool_parser="hermes")
MESSAGES = [{"role": "user", "content": "hi"}]
TOOLS = [{"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}]


def _refusal(parse, body) -> ApiError:
    with pytest.raises(ApiError) as caught:
        parse(body)
    assert caught.value.status == 400
    return caught.value


def test_a_completion_carries_its_sampling_params():
    request = CompletionRequest.parse({"prompt": ["a", "b"], "temperature": 0.5, "n": 2,
                                       "stop": "x", "seed": 3, "logprobs": 2,
                                       "deadline": 7}, TERMS)
    assert request.prompts == ["a", "b"] and request.deadline == 7.0
    params = request.params
    assert (params.temperature, params.n, params.stop, params.seed, params.logprobs) == (
        0.5, 2, ("x",), 3, 2)
    assert params.max_tokens == 16 and params.prompt_logprobs is None   # the API's default
    assert not request.stream.stream and request.generated_tokens == 16


def test_scoring_runs_as_one_token_with_the_prompt_table():
    request = CompletionRequest.parse({"prompt": [1, 2, 3], "max_tokens": 0, "echo": True,
                                       "logprobs": 1}, TERMS)
    assert request.score_only and request.generated_tokens == 0
    assert request.params.max_tokens == 1 and request.params.prompt_logprobs == 1
    assert request.prompts == [[1, 2, 3]]


def test_a_structured_output_is_in_the_params_and_kept_for_admission():
    request = CompletionRequest.parse({"prompt": "x", "guided_regex": "[a-z]+"}, TERMS)
    assert request.constraint == ({"regex": "[a-z]+"}, "guided_regex")
    assert request.params.structured_output == {"regex": "[a-z]+"}


def test_a_chat_request_holds_its_tool_plan_and_constraint():
    request = ChatRequest.parse({"messages": MESSAGES, "tools": TOOLS,
                                 "tool_choice": "required", "logprobs": True,
                                 "top_logprobs": 2, "max_completion_tokens": 4}, TERMS)
    assert request.tools.mode == "required" and request.constraint[1] == "tools"
    assert request.params.structured_output == request.constraint[0]
    assert request.params.max_tokens == 4 and request.params.logprobs == 2
    assert request.chars == 2
    auto = ChatRequest.parse({"messages": MESSAGES, "tools": TOOLS}, TERMS)
    assert auto.tools.mode == "auto" and auto.tools.parser == "hermes"
    assert auto.constraint is None and auto.params.max_tokens is None   # up to the context


@pytest.mark.parametrize("body, param, words", [
    ({"prompt": "x", "frobnicate": 1}, "frobnicate", "Unrecognized"),
    ({"prompt": "x", "logprobs": 6}, "logprobs", "[0, 5]"),
    ({"prompt": "x", "echo": True, "stream": True}, "echo", "not supported with stream"),
    ({"prompt": "x", "max_tokens": 0}, "max_tokens", "0 is allowed with echo"),
    ({"prompt": "x", "max_tokens": 0, "echo": True, "guided_regex": "a"}, "guided_regex",
     "generates nothing to constrain"),
    ({"prompt": "x", "temperature": -1}, "temperature", "temperature"),
    ({"prompt": [], "max_tokens": 1}, "prompt", "non-empty"),
    ({"prompt": "x", "deadline": 0}, "deadline", "(0, 86400]"),
    ({"prompt": "x", "stream_options": {"include_usage": True}}, "stream_options",
     "only allowed when stream is true"),
])
def test_completion_refusals_name_the_field(body, param, words):
    error = _refusal(lambda b: CompletionRequest.parse(b, TERMS), body)
    assert error.param == param and words in error.message, error.message


@pytest.mark.parametrize("body, param, words", [
    ({"messages": MESSAGES, "top_logprobs": 2}, "top_logprobs", "needs logprobs"),
    ({"messages": MESSAGES, "tool_choice": {"type": "function", "function": {"name": [1]}},
      "tools": TOOLS}, "tool_choice", "must be a string"),
    ({"messages": MESSAGES, "tools": TOOLS, "tool_choice": "required",
      "guided_json": {"type": "object"}}, "guided_json", "send one or the other"),
    ({"messages": []}, "messages", "non-empty list"),
    ({"messages": MESSAGES, "deadline": True}, "deadline", "seconds"),
])
def test_chat_refusals_name_the_field(body, param, words):
    error = _refusal(lambda b: ChatRequest.parse(b, TERMS), body)
    assert error.param == param and words in error.message, error.message


def test_auto_tool_choice_needs_a_parser():
    error = _refusal(lambda b: ChatRequest.parse(b, ServerTerms(5)),
                     {"messages": MESSAGES, "tools": TOOLS})
    assert error.param == "tool_choice" and "--tool-call-parser" in error.message


def test_tokenize_and_detokenize_bodies():
    plain = TokenizeRequest.parse({"prompt": "abc"})
    assert (plain.field, plain.chars, plain.add_special_tokens) == ("prompt", 3, True)
    chat = TokenizeRequest.parse({"messages": MESSAGES, "return_token_strs": True})
    assert (chat.field, chat.add_special_tokens, chat.add_generation_prompt) == (
        "messages", False, True)
    assert chat.return_token_strs
    assert _refusal(TokenizeRequest.parse, {"prompt": "a", "messages": MESSAGES}
                    ).param == "messages"
    assert _refusal(TokenizeRequest.parse, {"prompt": "a", "add_generation_prompt": True}
                    ).param == "add_generation_prompt"
    assert _refusal(TokenizeRequest.parse, {"prompt": "a", "return_token_strs": 1}
                    ).param == "return_token_strs"
    assert DetokenizeRequest.parse({"tokens": [1, 2]}).tokens == [1, 2]
    assert _refusal(DetokenizeRequest.parse, {"tokens": [True]}).param == "tokens"
