"""Which parser a server may run (checked at start, before it serves), the template
variables a request may set, and the reasoning token count of a whole answer."""

from __future__ import annotations

import pytest

from folio.frontend.openai.errors import ApiError
from folio.frontend.reasoning.parsers import Reasoning, check_parser
from folio.frontend.reasoning.request_fields import template_kwargs
from folio.frontend.reasoning.tokens import reasoning_tokens
from folio.shared.settings import SettingError
from tests.http_server import HttpServer


def _tokenizer(path):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(path))


def test_a_parser_needs_its_marker_in_the_vocabulary(tokenizer_dir, reasoning_model):
    check_parser(None, _tokenizer(tokenizer_dir))
    check_parser("qwen3", _tokenizer(reasoning_model[0]))
    check_parser("deepseek_r1", _tokenizer(reasoning_model[0]))
    for name, tokenizer, says in (("qwen3", tokenizer_dir, "</think>"),
                                  ("gpt_oss", reasoning_model[0], "<|channel|>"),
                                  ("granite", reasoning_model[0], "unknown")):
        with pytest.raises(SettingError) as refused:
            check_parser(name, _tokenizer(tokenizer))
        assert refused.value.setting == "reasoning_parser" and says in refused.value.problem


def test_serve_refuses_a_parser_the_model_cannot_use(tmp_path, reasoning_model):
    server = HttpServer(reasoning_model[0], tmp_path, "--reasoning-parser", "gpt_oss")
    try:
        with pytest.raises(RuntimeError) as exited:
            server.wait_ready()
        assert "--reasoning-parser gpt_oss: this model's tokenizer has no <|channel|>" in \
            str(exited.value)
        assert "Traceback" not in str(exited.value)
    finally:
        server.stop()


@pytest.mark.parametrize("body, parser, grammar, kwargs", [
    ({}, "qwen3", None, {}),
    ({"reasoning_effort": "none"}, "qwen3", None, {"enable_thinking": False}),
    ({"reasoning_effort": "high"}, "gpt_oss", None,
     {"enable_thinking": True, "reasoning_effort": "high"}),
    ({"chat_template_kwargs": {"enable_thinking": False}}, None, None,
     {"enable_thinking": False}),
    ({}, "qwen3", "response_format", {"enable_thinking": False}),   # no room to reason
    ({}, None, "tools", {}),
])
def test_template_variables(body, parser, grammar, kwargs):
    assert template_kwargs(body, parser, grammar) == kwargs


@pytest.mark.parametrize("body, parser, grammar", [
    ({"reasoning_effort": "low"}, None, None),
    ({"reasoning_effort": "none"}, "gpt_oss", None),
    ({"reasoning_effort": "minimal"}, "qwen3", None),
    ({"chat_template_kwargs": {"add_generation_prompt": False}}, "qwen3", None),
    ({"chat_template_kwargs": {"enable_thinking": "yes"}}, "qwen3", None),
    ({"chat_template_kwargs": {"enable_thinking": True}}, "qwen3", "tools"),
])
def test_bad_template_variables_are_refused_by_name(body, parser, grammar):
    with pytest.raises(ApiError) as refused:
        template_kwargs(body, parser, grammar)
    assert refused.value.status == 400 and refused.value.param == next(iter(body))


def test_whole_answer_reasoning_tokens(reasoning_model, reasoning_tokens):
    path, chain = reasoning_model
    tokenizer = _tokenizer(path)
    assert reasoning_tokens_of(tokenizer, chain, True) == reasoning_tokens
    # A prompt that did not open <think>: the answer has no reasoning, nothing counts.
    assert reasoning_tokens_of(tokenizer, chain, False) == 0


def reasoning_tokens_of(tokenizer, chain, opened):
    return reasoning_tokens(Reasoning("qwen3", opened), tokenizer, chain)
