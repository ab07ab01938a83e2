"""The one input processor (frontend/input_processor.py): its checks, the field each refusal
names, and the same bad prompt refused with the same words through the SDK gateway and by
folio.LLM."""

from __future__ import annotations

import asyncio

import pytest
import zmq.asyncio

from folio import LLM
from folio.client import AsyncClient
from folio.errors import RequestRejected
from folio.frontend.input_processor import InputError, InputProcessor, ModelFacts
from folio.frontend.prep import Preparer
from folio.shared.hf_tokenizer import load_tokenizer
from folio.frontend.zmq_gateway import ZmqGateway
from folio.shared.sampling_params import SamplingParams

FACTS = ModelFacts(vocab_size=1024, max_model_len=200, max_logprobs=5, max_n=4)


def _refusal(processor: InputProcessor, params: SamplingParams, **prompt) -> InputError:
    with pytest.raises(InputError) as caught:
        processor.process(params, FACTS, **prompt)
    return caught.value


@pytest.mark.parametrize("prompt, params, param, context_length, words", [
    ({"token_ids": []}, SamplingParams(), "prompt", False, "at least one token"),
    ({"token_ids": [5] * 201}, SamplingParams(), "prompt", True,
     "prompt has 201 tokens, more than this model's maximum context length "
     "max_model_len = 200"),
    ({"token_ids": [5] * 200}, SamplingParams(max_tokens=None), "prompt", True,
     "leaving no room for a generated token under max_model_len = 200"),
    ({"token_ids": [5] * 180}, SamplingParams(max_tokens=30), "prompt", True,
     "prompt (180 tokens) plus max_tokens (30) is 210 tokens, more than max_model_len = 200"),
    ({"token_ids": [5, 1024]}, SamplingParams(), "prompt", False,
     "prompt token id 1024 is outside the vocabulary [0, 1024)"),
    ({"token_ids": [5]}, SamplingParams(n=5), "n", False, "n must be <= 4"),
    ({"token_ids": [5]}, SamplingParams(logprobs=6), "logprobs", False,
     "logprobs must be in [0, 5]"),
    ({"token_ids": [5]}, SamplingParams(stop_token_ids=[2000]), "stop_token_ids", False,
     "stop_token_ids has token id 2000"),
    ({"prompt": "hello"}, SamplingParams(), "prompt", False, "text prompts need a tokenizer"),
    ({"token_ids": [5]}, SamplingParams(stop=["x"]), "stop", False,
     "stop strings need a tokenizer"),
])
def test_each_refusal_names_its_field(prompt, params, param, context_length, words):
    error = _refusal(InputProcessor(None), params, **prompt)
    assert isinstance(error, ValueError)   # folio.LLM raises it as is
    assert (error.param, error.context_length) == (param, context_length)
    assert words in str(error)


def test_scoring_a_prompt_is_worded_as_such():
    # max_tokens 0 scoring runs as max_tokens 1: one position past the prompt.
    error = _refusal(InputProcessor(None), SamplingParams(max_tokens=1),
                     token_ids=[5] * 200, score_only=True)
    assert str(error) == ("prompt has 200 tokens: scoring it (max_tokens 0) needs one "
                          "position beyond the prompt, and max_model_len = 200")
    assert error.context_length
    InputProcessor(None).process(SamplingParams(max_tokens=1), FACTS, token_ids=[5] * 199,
                                 score_only=True)


def test_text_and_chat(tokenizer_dir):
    processor = InputProcessor(load_tokenizer(tokenizer_dir))
    ready = processor.process(SamplingParams(stop=["a", "bc"]), FACTS, prompt="hello there")
    assert ready.ids == processor.tokenizer.encode("hello there", add_special_tokens=True)
    assert ready.stops.stops == ("a", "bc")
    huge = "x" * (2 * 200 * processor.token_chars + 1)
    error = _refusal(processor, SamplingParams(), messages=[{"role": "user",
                                                             "content": huge}])
    assert (error.param, error.context_length) == ("messages", True)
    assert "cannot fit this model's maximum context length max_model_len = 200" in str(error)
    with pytest.raises(InputError, match="prompt has 201 tokens") as caught:
        processor.check_count(201, FACTS)
    assert caught.value.context_length
    processor.check_count(200, FACTS)


class _Engine:
    """The gateway's engine, checking prompts with an LLM's own input processor and facts:
    nothing that passes them is expected here."""

    def __init__(self, llm: LLM) -> None:
        self.inputs, self.facts = llm.inputs, llm.facts
        self.tokenizer = llm.tokenizer
        self.prep = Preparer()
        self.draining, self.engine_alive = False, True
        self.pooling = None   # the generate runner
        self.submitted: list[list[int]] = []

    def submit(self, ids, params, sink, deadline=None, stops=None, client=None) -> str:
        self.submitted.append(ids)
        return f"r{len(self.submitted)}"


# (An empty prompt is refused by the wire before it reaches the gateway's checks.)
BAD = [
    ([7] * 201, SamplingParams(max_tokens=4)),
    ([5] * 180, SamplingParams(max_tokens=30)),
    ([5, 1024], SamplingParams()),
    ([5], SamplingParams(stop_token_ids=[4096])),
    ("x" * 200_000, SamplingParams()),   # over the gateway's inline size: the pool's path
]


def test_the_sdk_gateway_and_llm_refuse_a_bad_prompt_in_the_same_words(llama_dir, tmp_path):
    llm = LLM(str(llama_dir), num_kv_blocks=64, max_model_len=200)
    expected = []
    for prompt, params in BAD:
        with pytest.raises(ValueError) as caught:
            llm.generate([prompt], params)
        expected.append(str(caught.value))
    assert llm.stats()["kv_blocks_free"] == 64

    async def served() -> list[str]:
        ctx = zmq.asyncio.Context()
        engine = _Engine(llm)
        address = f"ipc://{tmp_path}/gw.sock"
        gateway = ZmqGateway(engine, address, ctx)
        serving = asyncio.create_task(gateway.serve())
        client = AsyncClient(address, timeout=60)
        answers = []
        try:
            for prompt, params in BAD:
                with pytest.raises(RequestRejected) as caught:
                    await client.generate(prompt, params)
                answers.append(str(caught.value))
        finally:
            await client.close()
            serving.cancel()
            await asyncio.gather(serving, return_exceptions=True)
            gateway.close()
            engine.prep.close()
            ctx.term()
        assert engine.submitted == []
        return answers

    assert asyncio.run(served()) == expected
