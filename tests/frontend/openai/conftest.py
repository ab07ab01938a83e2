"""One `folio serve` on the tiny llama, and an openai client of it, for this package's
OpenAI-API modules (route fields, scoring, structured output): its flags are the union of
what they need, so one start serves the three (each start is seconds of the suite's ten
minutes). A module on another model defines its own `client`."""

from __future__ import annotations

import pytest

from tests.frontend.openai.served import ALIAS, KEY, MODEL
from tests.http_server import openai_client, serving


@pytest.fixture(scope="package")
def server(tmp_path_factory, llama_dir):
    with serving(llama_dir, tmp_path_factory.mktemp("openai"), "--api-key", KEY,
                 "--served-model-name", MODEL, ALIAS, "--max-n", "20",
                 "--num-kv-blocks", "256", "--max-num-seqs", "24") as srv:
        yield srv


@pytest.fixture(scope="package")
def client(server):
    return openai_client(server, KEY)
