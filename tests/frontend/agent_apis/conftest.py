"""One `folio serve` for the OpenAI Responses and Anthropic Messages modules: the tiny llama
with a chat template that renders tools and tool results (test_tool_calls.py's Hermes
style), --tool-call-parser hermes, an API key, and a response store of STORE_SIZE (small,
so eviction is cheap to reach). One start serves both modules."""

from __future__ import annotations

import time

import pytest

from folio.client import Client
from tests.frontend.openai.test_tool_calls import TEMPLATE
from tests.http_server import openai_client, serving, with_chat_template

KEY = "sk-agent-apis"
MODEL = "tiny"
STORE_SIZE = 4
WEATHER = {"type": "object", "properties": {
    "city": {"type": "string", "maxLength": 12},
    "unit": {"enum": ["celsius", "fahrenheit"]}},
    "required": ["city", "unit"], "additionalProperties": False}


@pytest.fixture(scope="package")
def server(tmp_path_factory, llama_dir):
    model_dir = with_chat_template(llama_dir, tmp_path_factory.mktemp("agent-model"), TEMPLATE)
    with serving(model_dir, tmp_path_factory.mktemp("agent-apis"), "--api-key", KEY,
                 "--served-model-name", MODEL, "--num-kv-blocks", "256",
                 "--tool-call-parser", "hermes",
                 "--responses-store-size", str(STORE_SIZE)) as srv:
        yield srv


@pytest.fixture(scope="package")
def client(server):
    return openai_client(server, KEY)


def idle_stats(server, timeout: float = 60.0) -> dict:
    """The engine's stats once nothing runs or waits (polled, not slept out)."""
    deadline = time.monotonic() + timeout
    while True:
        with Client(server.zmq_address) as sdk:
            stats = sdk.health()["stats"]
        if stats["num_running"] == stats["num_waiting"] == 0 or time.monotonic() > deadline:
            return stats
        time.sleep(0.05)
