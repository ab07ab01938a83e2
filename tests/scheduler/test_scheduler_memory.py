"""Prefix caching, chunked prefill, swap and recompute preemption, n > 1: each one gives
the same greedy tokens as a run with none of them, and its counter shows it ran."""

from __future__ import annotations

import random

import pytest

from folio import LLM, SamplingParams
from tests.hf_oracle import hf_greedy

pytestmark = pytest.mark.parity

PLAIN = dict(enable_prefix_caching=False, num_kv_blocks=2048, max_num_batched_tokens=4096)


def _workload(seed: int = 5, count: int = 10):
    rng = random.Random(seed)
    shared = [rng.randrange(1, 1024) for _ in range(70)]
    prompts = []
    for i in range(count):
        tail = [rng.randrange(1, 1024) for _ in range(rng.randint(1, 60))]
        prompts.append(shared[:rng.randint(20, 70)] + tail if i % 3 else tail)
    return prompts, [rng.randint(4, 30) for _ in range(count)]


PROMPTS, MAX_TOKENS = _workload()


def _run(model_dir, **engine):
    llm = LLM(str(model_dir), dtype="float32", **engine)
    params = [SamplingParams(temperature=0, max_tokens=n) for n in MAX_TOKENS]
    outputs = [r.outputs[0].token_ids for r in llm.generate(PROMPTS, params)]
    return outputs, llm.stats()


@pytest.fixture(scope="module")
def plain(llama_dir):
    outputs, _ = _run(llama_dir, **PLAIN)
    assert outputs == hf_greedy(llama_dir, PROMPTS, MAX_TOKENS)
    return outputs


def _assert_idle(stats):
    assert stats["kv_blocks_free"] == stats["kv_blocks_total"]
    assert stats["swap_blocks_free"] == stats["swap_blocks_total"]
    assert stats["num_running"] == stats["num_waiting"] == stats["num_swapped"] == 0


def test_prefix_caching(llama_dir, plain):
    llm = LLM(str(llama_dir), dtype="float32", num_kv_blocks=512, block_size=8)
    params = [SamplingParams(temperature=0, max_tokens=n) for n in MAX_TOKENS]
    first = [r.outputs[0].token_ids for r in llm.generate(PROMPTS, params)]
    again = [r.outputs[0].token_ids for r in llm.generate(PROMPTS, params)]
    stats = llm.stats()
    assert first == again == plain
    assert stats["prefix_cache_hits"] > 0.5 * sum(map(len, PROMPTS))   # the second pass hit
    assert stats["prefix_cache_queries"] >= 2 * sum(map(len, PROMPTS))
    assert stats["kv_blocks_cached"] > 0
    _assert_idle(stats)


def test_chunked_prefill_budget_32(llama_dir, plain):
    outputs, stats = _run(llama_dir, enable_prefix_caching=False, num_kv_blocks=512,
                          max_num_batched_tokens=32)
    assert outputs == plain
    assert stats["steps"] > sum(map(len, PROMPTS)) // 32
    _assert_idle(stats)


def test_swap_preemption(llama_dir, plain):
    outputs, stats = _run(llama_dir, num_kv_blocks=14, preemption_mode="swap",
                          num_swap_blocks=64, enable_prefix_caching=False,
                          max_num_batched_tokens=64)
    assert outputs == plain
    assert stats["preemptions_swap"] > 0 and stats["preemptions_recompute"] == 0
    assert stats["swap_blocks_total"] == 64
    _assert_idle(stats)


def test_recompute_preemption(llama_dir, plain):
    outputs, stats = _run(llama_dir, num_kv_blocks=14, preemption_mode="recompute",
                          max_num_batched_tokens=64)
    assert outputs == plain
    assert stats["preemptions_recompute"] > 0 and stats["preemptions_swap"] == 0
    _assert_idle(stats)


def test_auto_preemption_swaps_when_cheaper_and_falls_back_when_full(llama_dir, plain):
    outputs, stats = _run(llama_dir, num_kv_blocks=14, preemption_mode="auto",
                          num_swap_blocks=12, max_num_batched_tokens=64)
    assert outputs == plain
    # On a CPU a block copy is far cheaper than recomputing its tokens; a small swap pool
    # forces some victims back to recompute.
    assert stats["preemptions_swap"] > 0
    _assert_idle(stats)


def test_n3_greedy_children_share_the_prompt(llama_dir, plain):
    llm = LLM(str(llama_dir), dtype="float32", num_kv_blocks=512)
    params = [SamplingParams(n=3, temperature=0, max_tokens=n) for n in MAX_TOKENS]
    results = llm.generate(PROMPTS, params)
    stats = llm.stats()
    for result, expected in zip(results, plain):
        assert [o.token_ids for o in result.outputs] == [expected] * 3
        assert [o.index for o in result.outputs] == [0, 1, 2]
    assert stats["forks"] == 2 * len(PROMPTS)
    _assert_idle(stats)


def test_n3_seeded_children_differ_and_reproduce(llama_dir):
    llm = LLM(str(llama_dir), dtype="float32", num_kv_blocks=256)
    params = SamplingParams(n=3, temperature=1.0, seed=1234, max_tokens=12)
    first = [o.token_ids for o in llm.generate([PROMPTS[1]], params)[0].outputs]
    second = [o.token_ids for o in llm.generate([PROMPTS[1]], params)[0].outputs]
    assert first == second
    assert len({tuple(t) for t in first}) == 3
    _assert_idle(llm.stats())
