"""A generation model asked to pool: a 400 naming the runner, on the package's one
generation server (tests/frontend/openai/conftest.py)."""

from __future__ import annotations

import openai
import pytest

from tests.frontend.openai.served import MODEL


@pytest.mark.parametrize("call", [
    lambda c: c.embeddings.create(model=MODEL, input="hello"),
    lambda c: c.post("/rerank", cast_to=object, body={"query": "a", "documents": ["b"]}),
    lambda c: c.post("/score", cast_to=object, body={"text_1": "a", "text_2": "b"}),
])
def test_pooling_on_the_generate_runner_is_a_400_naming_it(client, call):
    with pytest.raises(openai.BadRequestError) as raised:
        call(client)
    error = raised.value.body
    assert error["code"] == "wrong_runner" and "generate runner" in error["message"]
