"""Requests that share a prefix and arrive together compute it once: a full block enters the
prefix cache when it is scheduled, so a request admitted later in the same step already
shares it (it reads the KV after the step's forward pass wrote it, layer by layer). Greedy
outputs equal a run without prefix caching."""

from __future__ import annotations

import random

import pytest

from folio import LLM, SamplingParams

pytestmark = pytest.mark.parity

PREFIX_LEN = 80
BLOCK_SIZE = 16
COUNT = 10


def _burst(seed: int = 11) -> list[list[int]]:
    rng = random.Random(seed)
    prefix = [rng.randrange(1, 1024) for _ in range(PREFIX_LEN)]
    return [prefix + [rng.randrange(1, 1024) for _ in range(rng.randint(1, 20))]
            for _ in range(COUNT)]


PROMPTS = _burst()
PARAMS = SamplingParams(temperature=0, max_tokens=12, ignore_eos=True)


def _llm(model_dir, caching: bool) -> LLM:
    return LLM(str(model_dir), dtype="float32", block_size=BLOCK_SIZE, num_kv_blocks=256,
               enable_prefix_caching=caching)


@pytest.fixture(scope="module")
def uncached(llama_dir):
    return [r.outputs[0].token_ids for r in _llm(llama_dir, False).generate(PROMPTS, PARAMS)]


def test_one_generate_call_computes_the_shared_prefix_once(llama_dir, uncached):
    llm = _llm(llama_dir, True)
    outputs = [r.outputs[0].token_ids for r in llm.generate(PROMPTS, PARAMS)]
    stats = llm.stats()
    assert outputs == uncached
    # Every request after the first takes the prefix's 5 full blocks.
    assert stats["prefix_cache_hits"] == (COUNT - 1) * PREFIX_LEN
    assert stats["kv_blocks_free"] == stats["kv_blocks_total"]


def test_hits_are_taken_in_the_first_step(llama_dir, uncached):
    engine = _llm(llama_dir, True).engine
    for i, prompt in enumerate(PROMPTS):
        engine.add_request(f"b{i}", prompt, PARAMS)
    tokens: dict[str, list[int]] = {f"b{i}": [] for i in range(COUNT)}
    first = engine.step()
    stats = engine.stats()
    assert stats["steps"] == 1 and stats["num_running"] == COUNT
    assert stats["prefix_cache_hits"] == (COUNT - 1) * PREFIX_LEN
    assert sorted(o.request_id for o in first) == sorted(tokens)   # every prompt sampled
    outputs = first
    while True:
        for output in outputs:
            tokens[output.request_id].extend(output.new_token_ids)
        if not engine.has_unfinished_requests():
            break
        outputs = engine.step()
    assert [tokens[f"b{i}"] for i in range(COUNT)] == uncached
