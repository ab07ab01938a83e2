"""Greedy output token-identical to transformers, under batching, chunking and preemption."""

from __future__ import annotations

import pytest

from folio import LLM, SamplingParams
from tests.conftest import TEST_DEVICE
from tests.hf_oracle import hf_greedy, random_prompts

pytestmark = pytest.mark.parity

PROMPTS, MAX_TOKENS = random_prompts(16, 1, 300, vocab=1024, seed=1234)


def _folio_greedy(model_dir, **engine_args) -> tuple[list[list[int]], dict]:
    llm = LLM(str(model_dir), dtype="float32", device=TEST_DEVICE, **engine_args)
    params = [SamplingParams(temperature=0.0, max_tokens=n) for n in MAX_TOKENS]
    results = llm.generate(PROMPTS, params)
    return [r.outputs[0].token_ids for r in results], llm.stats()


@pytest.fixture(scope="module")
def expected(request):
    cache = {}

    def get(model_dir):
        if model_dir not in cache:
            cache[model_dir] = hf_greedy(model_dir, PROMPTS, MAX_TOKENS, TEST_DEVICE)
        return cache[model_dir]
    return get


@pytest.mark.parametrize("fixture", ["llama_dir", "qwen2_dir", "mistral_dir", "llama3_rope_dir"])
def test_greedy_matches_transformers_large_pool(fixture, expected, request):
    model_dir = request.getfixturevalue(fixture)
    outputs, stats = _folio_greedy(model_dir, num_kv_blocks=2048)
    assert outputs == expected(model_dir)
    assert stats["preemptions_recompute"] == 0
    assert stats["kv_blocks_free"] == stats["kv_blocks_total"]


@pytest.mark.parametrize("fixture", ["llama_dir", "qwen2_dir"])
def test_greedy_matches_transformers_under_preemption(fixture, expected, request):
    model_dir = request.getfixturevalue(fixture)
    # 24 blocks of 16 tokens: the longest request (340 tokens) just fits alone, so
    # requests queue for memory and running ones are preempted and recomputed.
    outputs, stats = _folio_greedy(model_dir, num_kv_blocks=24, max_num_batched_tokens=128)
    assert outputs == expected(model_dir)
    assert stats["preemptions_recompute"] > 0
    assert stats["kv_blocks_free"] == stats["kv_blocks_total"] == 24
    assert stats["num_running"] == stats["num_waiting"] == 0


def test_greedy_matches_with_small_blocks_and_chunks(llama_dir, expected):
    outputs, stats = _folio_greedy(llama_dir, block_size=4, num_kv_blocks=400,
                                   max_num_batched_tokens=37, max_num_seqs=5)
    assert outputs == expected(llama_dir)
    assert stats["kv_blocks_free"] == 400


def test_eos_stops_and_ignore_eos_continues(llama_dir):
    llm = LLM(str(llama_dir), dtype="float32", num_kv_blocks=256)
    first = llm.generate([[5, 6, 7]], SamplingParams(temperature=0, max_tokens=3))[0]
    eos = first.outputs[0].token_ids[0]
    # Declare the first greedy token a stop token: generation ends right after it.
    stopped = llm.generate([[5, 6, 7]], SamplingParams(temperature=0, max_tokens=8,
                                                       stop_token_ids=[eos]))[0].outputs[0]
    assert stopped.token_ids == [eos] and stopped.finish_reason == "stop"
    longer = llm.generate([[5, 6, 7]], SamplingParams(temperature=0, max_tokens=8))[0].outputs[0]
    assert len(longer.token_ids) == 8 and longer.finish_reason == "length"


NGRAM = ('{"method": "ngram", "num_speculative_tokens": 4, "prompt_lookup_min": 1, '
         '"max_running": 64}')
SUFFIX = ('{"method": "suffix", "num_speculative_tokens": 4, "max_running": 64, '
          '"suffix_decoding_min_match_len": 1, "suffix_decoding_max_cached_requests": 4}')


@pytest.mark.parametrize("spec, engine_args", [
    (NGRAM, {"num_kv_blocks": 2048}),
    (NGRAM, {"num_kv_blocks": 24, "max_num_batched_tokens": 128}),
    (NGRAM, {"block_size": 4, "num_kv_blocks": 400, "max_num_batched_tokens": 37,
             "max_num_seqs": 5}),
    (SUFFIX, {"num_kv_blocks": 24, "max_num_batched_tokens": 128}),
], ids=["large-pool", "preemption", "small-blocks-chunks", "suffix-preemption"])
def test_greedy_matches_transformers_with_speculation(llama_dir, expected, spec, engine_args):
    """n-gram and suffix drafts verified in the same pass (docs/spec_decode.md): still
    transformers' tokens, with drafts accepted."""
    outputs, stats = _folio_greedy(llama_dir, speculative_config=spec, **engine_args)
    assert outputs == expected(llama_dir)
    assert stats["spec_decode_num_accepted_tokens"] > 0
    assert stats["kv_blocks_free"] == stats["kv_blocks_total"]
