"""The hybrid MoE families (Qwen3.5-MoE, Qwen3-Next, LFM2-MoE): greedy output
token-identical to transformers in float32 on tiny random checkpoints, alone, in a batch of
prompts of different lengths (chunked prefill splitting the long ones) beside sampled and
n > 1 requests, under recompute preemption, and a second turn
sharing a long prefix that resumes from a state checkpoint with the hit shown; every block
and state slot free when idle."""

from __future__ import annotations

import pytest

from folio import LLM, SamplingParams
from tests.conftest import TEST_DEVICE
from tests.executor.hybrid.checkpoints import (assert_idle, assert_resumes_from_a_checkpoint,
                                              two_turns)
from tests.executor.hybrid.moe_checkpoints import make_moe_dir
from tests.hf_oracle import hf_greedy, random_prompts

pytestmark = pytest.mark.parity

PROMPTS, _LONGER = random_prompts(5, 1, 100, vocab=1024, seed=41)
MAX_TOKENS = [min(n, 10) for n in _LONGER]
TURNS = two_turns(seed=42)


@pytest.fixture(scope="module", params=["qwen3_5_moe", "qwen3_next", "lfm2_moe"])
def moe_model(request, tmp_path_factory, tokenizer_dir):
    path = make_moe_dir(tmp_path_factory.mktemp(request.param), tokenizer_dir,
                        request.param)
    expected = hf_greedy(path, PROMPTS + TURNS, MAX_TOKENS + [8, 8], TEST_DEVICE)
    return path, expected[:len(PROMPTS)], expected[len(PROMPTS):]


def test_greedy_matches_transformers_alone_batched_and_preempted(moe_model):
    model_dir, expected, _ = moe_model
    assert len({t for answer in expected for t in answer}) > 15   # not one repeated token
    params = [SamplingParams(temperature=0.0, max_tokens=n) for n in MAX_TOKENS]
    llm = LLM(str(model_dir), dtype="float32", device=TEST_DEVICE, num_kv_blocks=128,
              max_num_batched_tokens=64)
    # Alone: the longest prompt by itself.
    (alone,) = llm.generate([PROMPTS[1]], [params[1]])
    assert alone.outputs[0].token_ids == expected[1]
    assert_idle(llm.stats())
    # Batched: every prompt at once, 64 tokens a step splitting the long ones, beside a
    # sampled request and a greedy one with n = 2 (each sibling in its own state slot).
    sampled = SamplingParams(temperature=1.0, seed=7, max_tokens=12)
    forked = SamplingParams(temperature=0.0, max_tokens=MAX_TOKENS[2], n=2)
    results = llm.generate(PROMPTS + [PROMPTS[0], PROMPTS[2]], params + [sampled, forked])
    assert [r.outputs[0].token_ids for r in results[:len(PROMPTS)]] == expected
    assert 0 < len(results[-2].outputs[0].token_ids) <= 12
    assert [o.token_ids for o in results[-1].outputs] == [expected[2]] * 2
    assert_idle(llm.stats())
    # 32 blocks of 4 tokens (the longest request needs 28), 16 tokens a step: a running
    # request is preempted, its state dropped and recomputed from position 0.
    small = LLM(str(model_dir), dtype="float32", device=TEST_DEVICE, num_kv_blocks=32,
                block_size=4, max_num_batched_tokens=16)
    assert [r.outputs[0].token_ids for r in small.generate(PROMPTS, params)] == expected
    stats = small.stats()
    assert stats["preemptions_recompute"] > 0
    assert_idle(stats)


def test_a_shared_prefix_resumes_from_a_state_checkpoint(moe_model):
    model_dir, _, expected = moe_model
    assert_resumes_from_a_checkpoint(model_dir, TURNS, expected)
