"""Every request field is honoured or refused by name; model names, --max-n, one
context-length code, /tokenize and /detokenize. The official `openai` client and raw HTTP
against a real `folio serve`."""

from __future__ import annotations

import subprocess
import sys
import time

import httpx
import openai
import pytest

from folio.default_model import default_model_path
from folio.frontend.openai.field_parsers import DEFAULT_MODEL_NAME, served_names
from tests.frontend.openai.served import KEY, MODEL, ALIAS
from tests.http_server import ROOT, free_port

pytestmark = pytest.mark.slow
MESSAGES = [{"role": "user", "content": "What is a tuple?"}]
TOOLS = [{"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}]


def _post(server, path: str, body: dict, key: str | None = KEY) -> httpx.Response:
    headers = {"Authorization": f"Bearer {key}"} if key else {}
    return httpx.post(f"{server.base}{path}", json=body, headers=headers, timeout=60)


def _error(response: httpx.Response) -> dict:
    assert response.status_code == 400, response.text
    error = response.json()["error"]
    assert set(error) == {"message", "type", "param", "code"}
    assert error["type"] == "invalid_request_error"
    return error


CHAT = {"model": MODEL, "messages": MESSAGES, "max_tokens": 2}
COMPLETION = {"model": MODEL, "prompt": "x", "max_tokens": 2}


@pytest.mark.parametrize("path, base, field, value, words", [
    # Tool calling and structured outputs are honoured (tests/frontend/openai/test_tool_calls.py,
    # tests/frontend/openai/test_structured_output.py); wrong values of them are refused by name.
    ("/v1/chat/completions", CHAT, "tools", "f", "tools must be a list"),
    ("/v1/chat/completions", CHAT, "tool_choice", "auto", "tool_choice needs tools"),
    ("/v1/chat/completions", CHAT, "functions", [{"name": "f"}], "deprecated"),
    ("/v1/chat/completions", CHAT, "function_call", "auto", "deprecated"),
    ("/v1/chat/completions", CHAT, "parallel_tool_calls", "yes", "must be a boolean"),
    ("/v1/chat/completions", CHAT, "response_format", {"type": "structural_tag"},
     "not supported"),
    ("/v1/chat/completions", CHAT, "response_format",
     {"type": "json_schema", "json_schema": {"name": "x", "schema": {"type": "strin"}}},
     "cannot be compiled"),
    ("/v1/chat/completions", CHAT, "response_format", "json", "must be an object"),
    ("/v1/chat/completions", CHAT, "guided_json", {"type": "objct"}, "cannot be compiled"),
    ("/v1/chat/completions", CHAT, "guided_choice", [], "choice must be a list"),
    ("/v1/chat/completions", CHAT, "structured_outputs", {"regex": "(a"},
     "cannot be compiled"),
    ("/v1/chat/completions", CHAT, "reasoning_effort", "low", "--reasoning-parser"),
    ("/v1/chat/completions", CHAT, "echo", True, "Unrecognized"),
    ("/v1/chat/completions", CHAT, "best_of", 1, "Unrecognized"),
    ("/v1/chat/completions", CHAT, "store", True, "only False"),
    ("/v1/chat/completions", CHAT, "modalities", ["text", "audio"], "not supported"),
    ("/v1/chat/completions", CHAT, "user", 5, "must be a string"),
    ("/v1/completions", COMPLETION, "guided_regex", "[a-z", "cannot be compiled"),
    ("/v1/completions", COMPLETION, "guided_grammar", "start: foo", "cannot be compiled"),
    ("/v1/completions", COMPLETION, "guided_decoding_backend", "xgrammar", "llguidance"),
    ("/v1/completions", COMPLETION, "response_format", {"type": "json_schema"},
     "json_schema must be an object"),
    ("/v1/completions", COMPLETION, "tools", TOOLS, "Unrecognized"),
    ("/v1/completions", COMPLETION, "suffix", "end", "Unrecognized"),
    ("/v1/completions", COMPLETION, "best_of", 3, "not supported"),
    ("/v1/completions", COMPLETION, "top_logprobs", 2, "Unrecognized"),
    ("/v1/completions", COMPLETION, "max_completion_tokens", 2, "Unrecognized"),
    ("/v1/completions", COMPLETION, "frobnicate", None, "Unrecognized"),
])
def test_refused_by_name(server, path, base, field, value, words):
    error = _error(_post(server, path, {**base, field: value}))
    assert error["param"] == field and words in error["message"]


def test_the_official_client_and_framework_payloads_pass(client, server):
    chat = client.chat.completions.create(
        model=MODEL, messages=MESSAGES, max_completion_tokens=3, temperature=0, user="u-1",
        metadata={"run": "a"}, store=False, service_tier="auto", seed=1, top_p=0.9,
        response_format={"type": "text"}, presence_penalty=0.1, frequency_penalty=0.1,
        logit_bias={"5": -1}, stop=["\n\n"], n=1, logprobs=True, top_logprobs=1,
        extra_body={"top_k": 5, "min_p": 0.0, "repetition_penalty": 1.1, "min_tokens": 1,
                    "ignore_eos": True, "skip_special_tokens": True, "stop_token_ids": [7],
                    "include_stop_str_in_output": False, "deadline": 30})
    assert chat.usage.completion_tokens == 3
    text = client.completions.create(model=MODEL, prompt="x", max_tokens=2, user="u-2",
                                     echo=False, best_of=1, logprobs=1, seed=2)
    assert text.usage.completion_tokens == 2
    stream = client.chat.completions.create(model=MODEL, messages=MESSAGES, max_tokens=2,
                                            stream=True, stream_options={"include_usage": True})
    assert list(stream)[-1].usage.completion_tokens == 2
    # LangChain's and LiteLLM's plain payloads: nulls for what they do not use.
    for body in ({"model": MODEL, "messages": MESSAGES, "stream": False, "n": 1,
                  "temperature": 0.7, "max_tokens": 2},
                 {"model": MODEL, "messages": MESSAGES, "max_tokens": 2, "user": "lite",
                  "tools": None, "tool_choice": None, "response_format": None,
                  "stream_options": None, "safety_identifier": "s", "prompt_cache_key": "k"}):
        response = _post(server, "/v1/chat/completions", body)
        assert response.status_code == 200, response.text


def test_model_names(client, server):
    assert [m.id for m in client.models.list().data] == [MODEL, ALIAS]
    assert client.models.retrieve(MODEL).id == MODEL
    assert client.models.retrieve(ALIAS).id == ALIAS   # a name with a slash
    with pytest.raises(openai.NotFoundError) as caught:
        client.models.retrieve("gpt-9")
    assert caught.value.body["code"] == "model_not_found"
    answer = client.completions.create(model=ALIAS, prompt="x", max_tokens=1)
    assert answer.model == MODEL                        # the first name is the one reported
    missing = httpx.get(f"{server.base}/v1/models/gpt-9",
                        headers={"Authorization": f"Bearer {KEY}"})
    assert missing.status_code == 404 and missing.json()["error"]["param"] == "model"


def test_served_names_default_to_the_checkpoint_directory():
    assert served_names(None, "/models/Qwen2.5-0.5B-Instruct/") == \
        ["Qwen2.5-0.5B-Instruct", "/models/Qwen2.5-0.5B-Instruct/"]   # as vLLM, the path too
    assert served_names(None, "Qwen2.5-0.5B-Instruct") == ["Qwen2.5-0.5B-Instruct"]
    assert served_names(["a", "b"], "/m") == ["a", "b"]
    assert served_names("a b", "/m") == ["a", "b"]      # FOLIO_SERVED_MODEL_NAME="a b"


def test_the_built_in_model_has_a_real_name():
    """Not its folder's name ("weights"); --served-model-name still wins."""
    builtin = default_model_path()
    assert served_names(None, str(builtin)) == [DEFAULT_MODEL_NAME] == ["folio-default"]
    assert served_names(None, f"{builtin}/") == ["folio-default"]
    assert served_names(["mine"], str(builtin)) == ["mine"]


NAMING = [
    ("llama", (), None),                  # None: the directory's name, then the path as given
    ("built-in", (), ["folio-default"]),
    ("built-in", ("--served-model-name", "mine"), ["mine"]),
]


def _start_frontend(run_dir, model, flags) -> tuple[subprocess.Popen, int]:
    port = free_port()
    proc = subprocess.Popen([sys.executable, "-m", "folio", "frontend", "--model",
                             str(model), "--client-address", f"ipc://{run_dir}/c.sock",
                             "--scheduler-address", f"ipc://{run_dir}/nobody.sock",
                             "--port", str(port), *flags], cwd=ROOT,
                            env={**__import__("os").environ, "PYTHONPATH": str(ROOT)})
    return proc, port


def _model_names(port: int) -> list[str]:
    deadline = time.monotonic() + 60
    while True:
        try:
            models = httpx.get(f"http://127.0.0.1:{port}/v1/models", timeout=1)
            break
        except httpx.HTTPError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.1)
    return [m["id"] for m in models.json()["data"]]


@pytest.fixture(scope="module")
def frontend_names(tmp_path_factory, llama_dir) -> list[list[str]]:
    """What each NAMING frontend (no engine behind it) lists at /v1/models: the three
    start side by side, not one after another."""
    started = []
    try:
        for which, flags, _ in NAMING:
            model = llama_dir if which == "llama" else default_model_path()
            started.append(_start_frontend(tmp_path_factory.mktemp("named"), model, flags))
        return [_model_names(port) for _, port in started]
    finally:
        for proc, _ in started:
            proc.terminate()
        for proc, _ in started:
            proc.wait(timeout=20)


@pytest.mark.parametrize("which, flags, names", NAMING)
def test_frontend_reports_its_model_names(frontend_names, llama_dir, which, flags, names):
    """A frontend with no engine still names its model."""
    listed = frontend_names[NAMING.index((which, flags, names))]
    assert listed == (names or [llama_dir.name, str(llama_dir)])


def test_n_is_bounded_by_max_n(client, server):
    many = client.completions.create(model=MODEL, prompt="x", max_tokens=1, n=17)
    assert len(many.choices) == 17                      # past the old hard-coded 16
    error = _error(_post(server, "/v1/completions", {**COMPLETION, "n": 21}))
    assert error["param"] == "n" and "max_n" in error["message"]


@pytest.mark.parametrize("path, body, param", [
    ("/v1/completions", {**COMPLETION, "prompt": [5] * 1025}, "prompt"),
    ("/v1/completions", {**COMPLETION, "prompt": [5] * 1000, "max_tokens": 100}, "prompt"),
    ("/v1/completions", {**COMPLETION, "prompt": "word " * 400_000}, "prompt"),
    ("/v1/chat/completions", {**CHAT, "max_tokens": 1024}, "messages"),
    ("/v1/chat/completions", {**CHAT, "messages": [{"role": "user",
                                                    "content": "word " * 400_000}]},
     "messages"),
])
def test_one_context_length_code(server, path, body, param):
    error = _error(_post(server, path, body))
    assert error["code"] == "context_length_exceeded" and error["param"] == param
    assert "max_model_len = 1024" in error["message"]


def test_tokenize_and_detokenize(server, client, llama_dir):
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(llama_dir)
    text = "for x in range(3):"
    answer = _post(server, "/tokenize", {"model": MODEL, "prompt": text}).json()
    assert answer["tokens"] == tokenizer.encode(text)
    assert answer["count"] == len(answer["tokens"]) and answer["max_model_len"] == 1024
    strs = _post(server, "/tokenize", {"prompt": text, "return_token_strs": True}).json()
    assert strs["token_strs"] == tokenizer.convert_ids_to_tokens(answer["tokens"])
    chat = _post(server, "/tokenize", {"model": MODEL, "messages": MESSAGES}).json()
    usage = client.chat.completions.create(model=MODEL, messages=MESSAGES,
                                           max_tokens=1).usage
    assert chat["count"] == usage.prompt_tokens        # what the chat route would send
    back = _post(server, "/detokenize", {"model": MODEL, "tokens": answer["tokens"]}).json()
    assert back == {"prompt": text}
    assert _post(server, "/tokenize", {"prompt": text}, key=None).status_code == 401
    assert _post(server, "/detokenize", {"tokens": [1]}, key="nope").status_code == 401
    assert _error(_post(server, "/detokenize", {"tokens": [10**6]}))["param"] == "tokens"
    assert _error(_post(server, "/tokenize", {"prompt": text, "foo": 1}))["param"] == "foo"
    assert _error(_post(server, "/tokenize", {"prompt": 5}))["param"] == "prompt"
    wrong = _post(server, "/tokenize", {"model": "gpt-9", "prompt": text})
    assert wrong.status_code == 404
