"""Qwen3.5 (Gated DeltaNet + gated attention) and LFM2 (short convolutions + attention):
greedy output token-identical to transformers in float32 on tiny random checkpoints, in
mixed batches of prompts of different lengths (chunked prefill splitting some), under
recompute preemption, and with n > 1; every block and state slot free when idle."""

from __future__ import annotations

import pytest

from folio import LLM, SamplingParams
from tests.conftest import TEST_DEVICE
from tests.executor.hybrid.checkpoints import (assert_idle, assert_native_decode_step,
                                              assert_resumes_from_a_checkpoint,
                                              make_hybrid_dir, two_turns)
from tests.hf_oracle import hf_greedy, random_prompts

pytestmark = pytest.mark.parity

# Lengths 1..120, up to 12 new tokens each (transformers' torch path of these layers is
# slow); 64 tokens per step splits the long prompts.
PROMPTS, _LONGER = random_prompts(6, 1, 120, vocab=1024, seed=39)
MAX_TOKENS = [min(n, 12) for n in _LONGER]


TURNS = two_turns(seed=40)


@pytest.fixture(scope="module", params=["qwen3_5", "lfm2"])
def hybrid(request, tmp_path_factory, tokenizer_dir):
    path = make_hybrid_dir(tmp_path_factory.mktemp(request.param), tokenizer_dir,
                           request.param)
    expected = hf_greedy(path, PROMPTS + TURNS, MAX_TOKENS + [8, 8], TEST_DEVICE)
    return path, expected[:len(PROMPTS)], expected[len(PROMPTS):]


def test_greedy_matches_transformers_batched_and_preempted(hybrid):
    model_dir, expected, _ = hybrid
    assert len({t for answer in expected for t in answer}) > 20   # not one repeated token
    params = [SamplingParams(temperature=0.0, max_tokens=n) for n in MAX_TOKENS]
    # Roomy: all eight in one batch, long prompts chunked at 64 tokens.
    llm = LLM(str(model_dir), dtype="float32", device=TEST_DEVICE, num_kv_blocks=256,
              max_num_batched_tokens=64)
    assert_native_decode_step(llm)
    assert [r.outputs[0].token_ids for r in llm.generate(PROMPTS, params)] == expected
    stats = llm.stats()
    assert stats["preemptions_recompute"] == 0
    assert_idle(stats)
    # 33 blocks of 4 tokens, as many as the longest request needs, 16 tokens a step:
    # requests queue and running ones are preempted, their state dropped and recomputed
    # from position 0.
    small = LLM(str(model_dir), dtype="float32", device=TEST_DEVICE, num_kv_blocks=33,
                block_size=4, max_num_batched_tokens=16)
    assert [r.outputs[0].token_ids for r in small.generate(PROMPTS, params)] == expected
    stats = small.stats()
    assert stats["preemptions_recompute"] > 0 and stats["preemptions_swap"] == 0
    assert_idle(stats)
    # n > 1, greedy: every sample is the single answer (the siblings compute their prompt
    # in their own state slot).
    n_params = SamplingParams(temperature=0.0, max_tokens=MAX_TOKENS[2], n=3)
    (result,) = llm.generate([PROMPTS[2]], [n_params])
    assert [o.token_ids for o in result.outputs] == [expected[2]] * 3
    assert_idle(llm.stats())


def test_a_shared_prefix_resumes_from_the_deepest_state_checkpoint(hybrid):
    model_dir, _, expected = hybrid
    assert_resumes_from_a_checkpoint(model_dir, TURNS, expected)


@pytest.mark.parametrize("setting, value", [("enable_lora", True)])
def test_what_a_hybrid_cannot_run_with_is_refused_by_name(hybrid, setting, value):
    from folio.preflight import check_engine
    from folio.shared.config import EngineConfig, SettingError

    model_dir, _, _ = hybrid
    with pytest.raises(SettingError) as info:
        check_engine(EngineConfig(model=str(model_dir), device="cpu", **{setting: value}))
    assert setting in str(info.value) and "hybrid model with recurrent state" in str(info.value)
