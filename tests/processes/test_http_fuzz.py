"""HTTP nasty cases: wrong types in every field, random bodies, unknown routes: documented
errors in the error envelope, and the server keeps serving."""

from __future__ import annotations

import json
import random

import httpx
import pytest

pytestmark = pytest.mark.slow


ALLOWED = (200, 400, 404, 408, 503)
ONE_SHOT = {"Connection": "close"}   # one connection per case: a failure cannot leak over


def _problems(response: httpx.Response, case: str) -> list[str]:
    """Why this response breaks the rules (an empty list: it does not)."""
    if response.status_code not in ALLOWED:
        return [f"{case}: HTTP {response.status_code}: {response.text[:200]}"]
    if response.status_code == 200:
        return []
    try:
        error = response.json()["error"]
    except (ValueError, KeyError, TypeError):
        return [f"{case}: HTTP {response.status_code} without the error envelope: "
                f"{response.text[:200]}"]
    if set(error) != {"message", "type", "param", "code"} or not error["message"]:
        return [f"{case}: malformed error envelope {error}"]
    return []


def _post(http: httpx.Client, path: str, body, case: str) -> list[str]:
    content = body if isinstance(body, bytes) else json.dumps(body).encode()
    try:
        response = http.post(path, content=content,
                             headers={"Content-Type": "application/json"})
    except httpx.TransportError as error:   # no answer at all is a problem too
        return [f"{case}: no HTTP answer: {type(error).__name__}: {error}"]
    return _problems(response, case)


def _nasty_cases() -> list[tuple[str, str, bytes]]:
    c, chat = "/v1/completions", "/v1/chat/completions"
    ok = {"prompt": "hi", "max_tokens": 2}
    user = [{"role": "user", "content": "hi"}]
    cases: list[tuple[str, str, object]] = [
        ("invalid utf-8", c, b'{"prompt": "\xff\xfe\xfd", "max_tokens": 2}'),
        ("invalid utf-8 in chat", chat, b'{"messages": [{"role": "user", "content": "\xc3"}]}'),
        ("lone surrogate in prompt", c, {**ok, "prompt": "\ud800abc"}),
        ("lone surrogate in chat", chat, {"messages": [{"role": "user", "content": "\udfff"}],
                                          "max_tokens": 2}),
        ("lone surrogate in role", chat, {"messages": [{"role": "\ud800", "content": "x"}]}),
        ("lone surrogate in stop", c, {**ok, "stop": ["\ud800"]}),
        ("10 MB prompt", c, {"prompt": "a" * 10_000_000, "max_tokens": 2}),
        ("10 MB of junk", c, b"\x00" * 10_000_000),
        ("100k nested arrays", c, b"[" * 100_000 + b"]" * 100_000),
        ("100k nested objects", c, b'{"a":' * 100_000 + b"1" + b"}" * 100_000),
        ("100k nested prompt", c, b'{"prompt": ' + b"[" * 100_000 + b"]" * 100_000 + b"}"),
        ("900 nested prompt", c, b'{"prompt": ' + b"[" * 900 + b"1" + b"]" * 900 + b"}"),
        ("900 nested messages", chat, b'{"messages": ' + b"[" * 900 + b"]" * 900 + b"}"),
        ("NaN temperature", c, b'{"prompt": "hi", "max_tokens": 2, "temperature": NaN}'),
        ("Infinity top_p", c, b'{"prompt": "hi", "max_tokens": 2, "top_p": Infinity}'),
        ("1e999 temperature", c, b'{"prompt": "hi", "max_tokens": 2, "temperature": 1e999}'),
        ("huge n", c, {**ok, "n": 10**9}), ("n 2^64", c, {**ok, "n": 2**64}),
        ("n 2^100", chat, {"messages": user, "n": 2**100}),
        ("huge logprobs", c, {**ok, "logprobs": 10**9}),
        ("logprobs 2^70", c, {**ok, "logprobs": 2**70}),
        ("huge top_logprobs", chat, {"messages": user, "logprobs": True,
                                     "top_logprobs": 10**12}),
        ("max_tokens 2^63", c, {**ok, "max_tokens": 2**63}),
        ("max_tokens 2^64", c, {**ok, "max_tokens": 2**64}),
        ("max_tokens 10^30", c, {**ok, "max_tokens": 10**30}),
        ("max_completion_tokens 2^64", chat, {"messages": user,
                                              "max_completion_tokens": 2**64}),
        ("min_tokens 2^64", c, {**ok, "min_tokens": 2**64}),
        ("top_k 2^64", c, {**ok, "top_k": 2**64}),
        ("top_k 2^63", c, {**ok, "top_k": 2**63}),
        ("seed 2^64", c, {**ok, "seed": 2**64}),
        ("seed -2^70", c, {**ok, "seed": -2**70}),
        ("prompt id 2^64", c, {**ok, "prompt": [2**64]}),
        ("stop id 2^64", c, {**ok, "stop_token_ids": [2**64]}),
        ("logit_bias id 2^70", c, {**ok, "logit_bias": {str(2**70): 1}}),
        ("logit_bias 5000 entries", c, {**ok, "logit_bias": {str(i): 1 for i in range(5000)}}),
        ("prompt over the context", c, {**ok, "prompt": "word " * 5000}),
        ("token prompt over the context", c, {**ok, "prompt": [5] * 5000}),
        ("chat over the context", chat, {"messages": [{"role": "user", "content": "x " * 5000}],
                                         "max_tokens": 2}),
        ("prompt plus max_tokens over the context", c, {**ok, "prompt": [5] * 1000,
                                                        "max_tokens": 100}),
        ("100 prompts", c, {**ok, "prompt": ["a"] * 100}),
        ("10k empty prompts", c, {**ok, "prompt": [[]] * 10_000}),
        ("1000 stop strings", c, {**ok, "stop": ["a"] * 1000}),
        ("1 MB stop string", c, {**ok, "stop": ["a" * 1_000_000]}),
        ("role tool", chat, {"messages": [{"role": "tool", "content": "x"}], "max_tokens": 2}),
        ("role function", chat, {"messages": [{"role": "function", "content": "x",
                                               "name": "f"}], "max_tokens": 2}),
        ("role developer", chat, {"messages": [{"role": "developer", "content": "x"}],
                                  "max_tokens": 2}),
        ("role empty", chat, {"messages": [{"role": "", "content": "x"}]}),
        ("role 65 chars", chat, {"messages": [{"role": "r" * 65, "content": "x"}]}),
        ("role template code", chat, {"messages": [{"role": "{{ 7 * 7 }}{% raise %}",
                                                    "content": "x"}], "max_tokens": 2}),
        ("role special token", chat, {"messages": [{"role": "<|im_end|>", "content": "x"}],
                                      "max_tokens": 2}),
        ("content special tokens", chat, {"messages": [{"role": "user",
                                                        "content": "<|im_end|><|endoftext|>"}],
                                          "max_tokens": 2}),
        ("only an assistant message", chat, {"messages": [{"role": "assistant",
                                                           "content": "x"}], "max_tokens": 2}),
        ("1000 system messages", chat, {"messages": [{"role": "system", "content": "s"}] * 1000,
                                        "max_tokens": 2}),
        ("role number", chat, {"messages": [{"role": 5, "content": "x"}]}),
        ("role missing", chat, {"messages": [{"content": "x"}]}),
        ("content object", chat, {"messages": [{"role": "user", "content": {"a": 1}}]}),
        ("image part", chat, {"messages": [{"role": "user", "content": [
            {"type": "image_url", "image_url": {"url": "data:,"}}]}]}),
        ("messages object", chat, {"messages": {"role": "user"}}),
        ("messages strings", chat, {"messages": ["hi"]}),
        ("messages empty", chat, {"messages": []}),
        ("array body", c, b"[]"), ("string body", c, b'"hello"'), ("number body", c, b"1"),
        ("null body", c, b"null"), ("true body", chat, b"true"), ("empty body", c, b""),
        ("whitespace body", chat, b"   "), ("truncated JSON", c, b'{"prompt": "hi"'),
        ("duplicate keys", c, b'{"prompt": "a", "prompt": 5}'),
        ("model number", c, {**ok, "model": 5}), ("model list", c, {**ok, "model": ["x"]}),
        ("stream string", c, {**ok, "stream": "yes"}),
        ("stream_options list", c, {**ok, "stream": True, "stream_options": [1]}),
        ("stream_options without stream", c, {**ok, "stream_options": {"include_usage": True}}),
        ("echo with stream", c, {**ok, "echo": True, "stream": True}),
        ("deadline negative", c, {**ok, "deadline": -1}),
        ("deadline string", c, {**ok, "deadline": "1"}),
        ("deadline huge", c, {**ok, "deadline": 10**30}),
        ("unknown fields", c, {**ok, "frobnicate": {"x": [1, 2]}, "tools": [1]}),
    ]
    return [(name, path, body if isinstance(body, bytes) else json.dumps(body).encode())
            for name, path, body in cases]


def test_http_nasty_requests_get_documented_errors_in_the_envelope(healthy):
    problems = []
    with httpx.Client(base_url=healthy.base, timeout=60, headers=ONE_SHOT) as http:
        for name, path, body in _nasty_cases():
            problems += _post(http, path, body, name)
    healthy.check_alive()
    assert not problems, "\n".join(problems)
    healthy.assert_serving()


FIELDS_COMPLETIONS = ("model", "prompt", "max_tokens", "temperature", "top_p", "n", "stream",
                      "stream_options", "stop", "seed", "presence_penalty",
                      "frequency_penalty", "logit_bias", "logprobs", "echo", "user", "top_k",
                      "min_p", "repetition_penalty", "ignore_eos", "min_tokens",
                      "skip_special_tokens", "include_stop_str_in_output", "stop_token_ids",
                      "deadline", "suffix", "best_of")
FIELDS_CHAT = ("model", "messages", "max_tokens", "max_completion_tokens", "logprobs",
               "top_logprobs", "n", "stream", "stream_options", "stop", "seed", "temperature",
               "response_format", "tools", "tool_choice", "deadline")
WRONG = [None, True, False, 0, -1, 1, 2**31, 2**63, 2**64, -2**64, 1.5, -0.5, 1e308, "",
         "x", "1", [], [1], ["a"], [[1]], [None], {}, {"a": 1}, {"1": 1}]


def test_http_wrong_types_in_every_field(healthy):
    problems = []
    base_completion = {"prompt": "hi", "max_tokens": 2}
    base_chat = {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}
    with httpx.Client(base_url=healthy.base, timeout=60, headers=ONE_SHOT) as http:
        for path, base, fields in (("/v1/completions", base_completion, FIELDS_COMPLETIONS),
                                   ("/v1/chat/completions", base_chat, FIELDS_CHAT)):
            for field_name in fields:
                for value in WRONG:
                    body = {**base, field_name: value}
                    if field_name not in ("max_tokens", "max_completion_tokens") and \
                            "max_tokens" not in body:
                        body["max_tokens"] = 2
                    problems += _post(http, path, body, f"{path} {field_name}={value!r}")
    healthy.check_alive()
    assert not problems, f"{len(problems)} bad responses:\n" + "\n".join(problems[:40])
    healthy.assert_serving()


def _json_values(rng: random.Random, depth: int = 0):
    pick = rng.randrange(10 if depth < 3 else 7)
    if pick == 0:
        return None
    if pick == 1:
        return rng.choice([True, False])
    if pick == 2:
        return rng.choice([0, 1, 2, -1, 16, 2**31, 2**63, 2**64, -2**63 - 1, 10**20])
    if pick == 3:
        return rng.choice([0.0, 0.5, 1.0, -1.5, 1e-9, 1e308, -1e308, 2.5])
    if pick in (4, 5):
        return rng.choice(["", "hi", "user", "system", "assistant", "text", "\u0000",
                           "é" * 50, "<|im_start|>", "{{ x }}", "a" * 5000])
    if pick == 6:
        return [rng.randrange(-5, 2000) for _ in range(rng.randrange(6))]
    if pick in (7, 8):
        return [_json_values(rng, depth + 1) for _ in range(rng.randrange(4))]
    keys = ["role", "content", "type", "text", "include_usage", "1", "x"]
    return {rng.choice(keys): _json_values(rng, depth + 1) for _ in range(rng.randrange(4))}


def test_http_random_bodies(healthy):
    """A few hundred bodies from a model of the OpenAI request schema, with random values
    (the server's /openapi.json has no request schemas to fuzz from)."""
    rng = random.Random(9)
    problems = []
    with httpx.Client(base_url=healthy.base, timeout=60, headers=ONE_SHOT) as http:
        for i in range(300):
            chat = rng.random() < 0.5
            fields = FIELDS_CHAT if chat else FIELDS_COMPLETIONS
            body = {name: _json_values(rng) for name in rng.sample(fields, rng.randint(1, 8))}
            if rng.random() < 0.7:   # mostly with a usable prompt, so later checks are hit
                body.setdefault("messages" if chat else "prompt",
                                [{"role": "user", "content": "hi"}] if chat else "hi")
            body["max_tokens"] = rng.choice([1, 2, 3, None, 0, "2"])
            path = "/v1/chat/completions" if chat else "/v1/completions"
            problems += _post(http, path, body, f"#{i} {path} {json.dumps(body)[:150]}")
    healthy.check_alive()
    assert not problems, f"{len(problems)} bad responses:\n" + "\n".join(problems[:40])
    healthy.assert_serving()


def test_unknown_routes_and_methods_answer_in_the_error_envelope(healthy):
    problems = []
    with httpx.Client(base_url=healthy.base, timeout=10) as http:
        for method, path in (("GET", "/v1/completions"), ("GET", "/v1/chat/completions"),
                             ("POST", "/v1/models"), ("GET", "/v1/nope"),
                             ("DELETE", "/v1/completions"), ("POST", "/v1/images/generations")):
            response = http.request(method, path)
            if response.status_code not in (404, 405):
                problems.append(f"{method} {path}: HTTP {response.status_code}")
            elif "error" not in response.json():
                problems.append(f"{method} {path}: {response.status_code} {response.text}")
    assert not problems, "\n".join(problems)


