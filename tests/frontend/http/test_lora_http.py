"""LoRA adapters over HTTP with a real `folio serve` (docs/lora.md): the model field picks
an adapter, /v1/models lists them under their base, adapters load and unload while other
requests run, and the guarded routes refuse what they cannot do."""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import time

import httpx
import openai
import pytest

from folio import Client, SamplingParams
from folio.errors import RequestRejected
from tests.http_server import openai_client, serving
from tests.lora_adapters import MAX_TOKENS as MAX_TOKENS_OF
from tests.lora_adapters import PROMPTS

KEY = "lora-key"
PROMPT, MAX_TOKENS = PROMPTS[0], MAX_TOKENS_OF[0]


@pytest.fixture(scope="module")
def adapters(lora_adapters) -> dict:
    return {"a": lora_adapters["all"], "b": lora_adapters["qv-down"]}


@pytest.fixture(scope="module")
def expected(long_llama_dir, lora_expected) -> dict:
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(str(long_llama_dir))
    return {"a": tokenizer.decode(lora_expected["all"][0]),
            "b": tokenizer.decode(lora_expected["qv-down"][0])}


@pytest.fixture(scope="module")
def server(long_llama_dir, adapters, tmp_path_factory):
    with serving(long_llama_dir, tmp_path_factory.mktemp("lora-http"), "--api-key", KEY,
                 "--served-model-name", "base", "--enable-lora", "--lora-modules",
                 f"a={adapters['a']}", "--max-loras", "2", "--max-cpu-loras", "2",
                 "--enable-lora-runtime-updates", "--dtype", "float32",
                 "--max-model-len", "32768", "--max-num-seqs", "8",
                 "--num-kv-blocks", "2100") as server:
        yield server


def _post(server, path: str, body: dict, key: str = KEY) -> httpx.Response:
    return httpx.post(f"{server.base}{path}", json=body, timeout=60,
                      headers={"Authorization": f"Bearer {key}"})


def _complete(client, model: str) -> str:
    return client.completions.create(model=model, prompt=PROMPT, max_tokens=MAX_TOKENS,
                                     temperature=0).choices[0].text


def test_load_use_unload_reload_while_a_request_runs(server, adapters, expected):
    client = openai_client(server, KEY)
    models = {m.id: m for m in client.models.list().data}
    assert models["a"].parent == "base" and models["base"].parent is None
    answer = client.completions.create(model="a", prompt=PROMPT, max_tokens=MAX_TOKENS,
                                       temperature=0)
    assert answer.model == "a" and answer.choices[0].text == expected["a"]
    # A long answer with adapter a runs while b is loaded, used and unloaded.
    stream = client.completions.create(model="a", prompt=PROMPT, max_tokens=30000,
                                       temperature=0, stream=True,
                                       extra_body={"ignore_eos": True})
    first = next(iter(stream))
    assert first.choices[0].text is not None
    metrics = httpx.get(f"{server.base}/metrics", headers={"Authorization": f"Bearer {KEY}"})
    assert 'folio:lora_num_requests_running{lora="a"} 1.0' in metrics.text
    loaded = _post(server, "/v1/load_lora_adapter", {"lora_name": "b",
                                                     "lora_path": str(adapters["b"])})
    assert loaded.status_code == 200, loaded.text
    assert "b" in {m.id for m in client.models.list().data}
    assert _complete(client, "b") == expected["b"]
    with Client(server.zmq_address, connect_timeout=30) as sdk:   # the SDK's lora=
        sdk_answer = sdk.generate(PROMPT, SamplingParams(temperature=0, max_tokens=MAX_TOKENS),
                                  lora="b")
        assert sdk_answer.text == expected["b"]
        with pytest.raises(RequestRejected, match="no LoRA adapter named 'nope' is loaded"):
            sdk.generate(PROMPT, SamplingParams(max_tokens=2), lora="nope")
    busy = _post(server, "/v1/unload_lora_adapter", {"lora_name": "a"})
    assert busy.status_code == 400 and "1 unfinished request" in busy.json()["error"]["message"], \
        busy.text
    assert _post(server, "/v1/unload_lora_adapter", {"lora_name": "b"}).status_code == 200
    with pytest.raises(openai.NotFoundError, match="'b' does not exist"):
        _complete(client, "b")
    stream.close()   # the client goes: the long request is aborted, adapter a is free
    while True:      # until the abort has reached the scheduler (an observed state)
        gone = _post(server, "/v1/unload_lora_adapter", {"lora_name": "a"})
        if gone.status_code == 200:
            break
        assert "unfinished request" in gone.json()["error"]["message"]
    # Reloaded under the name of the other: b's weights answer as "a", nothing cached of
    # the old "a" is reused.
    assert _post(server, "/v1/load_lora_adapter", {"lora_name": "a",
                                                   "lora_path": str(adapters["b"])}
                 ).status_code == 200
    assert _complete(client, "a") == expected["b"]
    assert _complete(client, "base") not in (expected["a"], expected["b"])


def test_bad_loads_are_refused_with_their_cause(server, adapters, tmp_path):
    cases = [
        ({"lora_name": "x", "lora_path": str(tmp_path / "none")}, "adapter_config.json is missing"),
        ({"lora_name": "base", "lora_path": str(adapters["a"])}, "is the base model's name"),
        ({"lora_name": "x"}, "lora_path must be a non-empty string"),
        ({"lora_name": "x", "lora_path": str(adapters["a"]), "extra": 1},
         "unsupported field(s): extra"),
    ]
    for body, message in cases:
        answer = _post(server, "/v1/load_lora_adapter", body)
        assert answer.status_code == 400 and message in answer.json()["error"]["message"], \
            answer.text
    assert _post(server, "/v1/load_lora_adapter", {"lora_name": "x", "lora_path": "/"},
                 key="wrong").status_code == 401
    assert _post(server, "/v1/unload_lora_adapter", {"lora_name": "nope"}).status_code == 404
    client = openai_client(server, KEY)
    with pytest.raises(openai.NotFoundError, match="model_not_found|does not exist"):
        _complete(client, "nope")


def test_a_bad_file_is_a_400_while_a_stream_goes_on(server, adapters, tmp_path):
    # A pattern that backtracks for ever, a FIFO that blocks a read, an invisible name:
    # each refused with its cause, nothing listed, the engine still stepping.
    spin, fifo = tmp_path / "spin", tmp_path / "fifo"
    for path in (spin, fifo):
        shutil.copytree(adapters["a"], path)
    config = json.loads((spin / "adapter_config.json").read_text())
    (spin / "adapter_config.json").write_text(json.dumps(config | {
        "alpha_pattern": {"(.*.*)*x": 8}}))
    (fifo / "adapter_config.json").unlink()
    os.mkfifo(fifo / "adapter_config.json")
    client = openai_client(server, KEY)
    stream = client.completions.create(model="base", prompt=PROMPT, max_tokens=30000,
                                       temperature=0, stream=True,
                                       extra_body={"ignore_eos": True})
    chunks = iter(stream)
    assert next(chunks).choices[0].text is not None
    cases = [("spin", spin, "alpha_pattern key '(.*.*)*x' is not a module name"),
             ("fifo", fifo, "a FIFO, not a regular file"),
             ("folio-default\u200b", adapters["a"], "U+200B")]
    for name, path, words in cases:
        answer = _post(server, "/v1/load_lora_adapter", {"lora_name": name,
                                                         "lora_path": str(path)})
        message = answer.json()["error"]["message"]
        assert answer.status_code == 400 and words in message, answer.text
        assert name != "spin" or str(spin / "adapter_config.json") in message
        assert next(chunks).choices[0].text is not None
    listed = {m.id for m in client.models.list().data}
    assert not listed & {name for name, _, _ in cases}, listed
    assert _complete(client, "base")   # a new request is stepped beside the stream
    assert next(chunks).choices[0].text is not None
    stream.close()


def test_adapters_past_max_cpu_loras_load_and_answer_in_turn(server, lora_adapters,
                                                             long_llama_dir, lora_expected):
    # The server holds two adapters in host memory (--max-cpu-loras 2) and has one or two
    # loaded already: four more load anyway, and each answers as transformers + PEFT does
    # with it, in turn and back again, its weights read from disk again once dropped.
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(str(long_llama_dir))
    extra = {"c": "all", "d": "qv-down", "e": "attn", "f": "mlp"}
    for name, adapter in extra.items():
        answer = _post(server, "/v1/load_lora_adapter", {"lora_name": name,
                                                         "lora_path": str(lora_adapters[adapter])})
        assert answer.status_code == 200, answer.text
    client = openai_client(server, KEY)
    for name in [*extra, *reversed(extra)]:
        assert _complete(client, name) == tokenizer.decode(lora_expected[extra[name]][0]), name
    for name in extra:
        assert _post(server, "/v1/unload_lora_adapter", {"lora_name": name}).status_code == 200


def test_the_replica_router_hashes_an_adapters_prompt_apart():
    # As the scheduler does: the same prompt under an adapter matches nothing the base
    # model (or another adapter) left on a replica.
    from folio.frontend.routing import PrefixRouter, ReplicaLoad

    router = PrefixRouter()
    prefix = list(range(3, 35))   # two full blocks of 16
    loads = [ReplicaLoad(0, 0, 100), ReplicaLoad(1, 0, 100)]
    router.choose(prefix + [1], 16, loads)
    assert router.choose(prefix + [2], 16, loads)[1] == 2
    assert router.choose(prefix + [3], 16, loads, "a")[1] == 0
    assert router.choose(prefix + [4], 16, loads, "a")[1] == 2
    assert router.choose(prefix + [5], 16, loads, "b")[1] == 0


def test_an_adapter_that_makes_nan_fails_its_own_request_alone(server, adapters, tmp_path):
    """Finite weights so large that the adapter's rows overflow: its request is a 500
    naming the cause and the adapter, not "engine unavailable"; a stream beside it and the
    next base request go on."""
    from safetensors.torch import load_file, save_file

    huge = tmp_path / "huge"
    shutil.copytree(adapters["a"], huge)
    weights = huge / "adapter_model.safetensors"
    tensors = {name: t * 1e30 if "lora_B" in name else t
               for name, t in load_file(str(weights)).items()}
    save_file(tensors, str(weights))
    assert _post(server, "/v1/load_lora_adapter", {"lora_name": "huge",
                                                   "lora_path": str(huge)}).status_code == 200
    client = openai_client(server, KEY)
    stream = client.completions.create(model="base", prompt=PROMPT, max_tokens=30000,
                                       temperature=0, stream=True,
                                       extra_body={"ignore_eos": True})
    chunks = iter(stream)
    assert next(chunks).choices[0].text is not None
    answer = _post(server, "/v1/completions", {"model": "huge", "prompt": PROMPT,
                                               "max_tokens": 4})
    error = answer.json()["error"]
    assert answer.status_code == 500 and error["code"] == "request_failed", answer.text
    assert "NaN or infinite" in error["message"] and "'huge'" in error["message"]
    assert next(chunks).choices[0].text is not None   # the stream beside it goes on
    assert httpx.get(f"{server.base}/health").status_code == 200
    assert _complete(client, "base")
    stream.close()
    assert _post(server, "/v1/unload_lora_adapter", {"lora_name": "huge"}).status_code == 200


def _executor_pids(server) -> list[int]:
    return [int(m) for m in re.findall(r"executor (\d+) attached", server.log.read_text())]


def _poll(condition, what: str, timeout: float = 120.0):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = condition()
        if value:
            return value
        time.sleep(0.1)   # polling an observed state, not waiting a time out
    raise AssertionError(f"not seen: {what}")


def test_runtime_adapters_survive_an_executor_restart(server, adapters, expected):
    """Last in the module: the executor is killed. An adapter loaded at run time is given
    to the restarted executor again (logged) and answers as before."""
    assert _post(server, "/v1/load_lora_adapter", {"lora_name": "runtime",
                                                   "lora_path": str(adapters["b"])}
                 ).status_code == 200
    client = openai_client(server, KEY)
    assert _complete(client, "runtime") == expected["b"]
    pids = _executor_pids(server)
    os.kill(pids[-1], signal.SIGKILL)
    _poll(lambda: len(_executor_pids(server)) > len(pids), "a new executor attached")
    _poll(lambda: "LoRA adapter 'runtime' re-registered" in server.log.read_text(),
          "the adapter re-registered")
    _poll(lambda: "runtime" in {m.id for m in client.models.list().data}, "it listed")
    assert _complete(client, "runtime") == expected["b"]
    assert _complete(client, "a") == expected["a"]   # --lora-modules' own, as ever
