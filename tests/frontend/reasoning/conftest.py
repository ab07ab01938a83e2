"""One `folio serve --reasoning-parser qwen3` on the reasoning checkpoint (checkpoint.py),
for the served reasoning tests of every API: one start serves them all."""

from __future__ import annotations

import pytest

from tests.frontend.reasoning.checkpoint import make_reasoning_checkpoint
from tests.http_server import openai_client, serving

KEY = "sk-reasoning"
MODEL = "thinker"


@pytest.fixture(scope="package")
def reasoning_model(tmp_path_factory):
    """(the checkpoint's directory, the tokens it generates)."""
    path = tmp_path_factory.mktemp("thinker")
    return path, make_reasoning_checkpoint(path)


@pytest.fixture(scope="package")
def server(tmp_path_factory, reasoning_model):
    with serving(reasoning_model[0], tmp_path_factory.mktemp("reasoning-serve"),
                 "--api-key", KEY, "--served-model-name", MODEL, "--num-kv-blocks", "256",
                 "--reasoning-parser", "qwen3") as srv:
        yield srv


@pytest.fixture(scope="package")
def client(server):
    return openai_client(server, KEY)


@pytest.fixture(scope="package")
def reasoning_tokens(reasoning_model):
    """How many generated tokens are reasoning: up to </think>, itself included."""
    from transformers import AutoTokenizer

    path, chain = reasoning_model
    think_end = AutoTokenizer.from_pretrained(str(path)).convert_tokens_to_ids("</think>")
    return chain.index(think_end) + 1
