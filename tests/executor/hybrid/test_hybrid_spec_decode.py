"""Speculative decoding on hybrid models: verifying drafts must leave each request's
recurrent state as if only the accepted tokens had been fed. Greedy output token-identical
with speculation on and off and to transformers in float32, on tiny random Qwen3.5 and
LFM2 checkpoints, alone and in a mixed batch; every block and state slot free when idle.

Random weights never repeat themselves, so n-gram drafts from a copy-heavy prompt are
proposed but almost never accepted. Accepted and partly rejected drafts come from suffix
decoding's global cache filled by seeded samples at a low temperature: each follows the
greedy answer for a while, then turns away, so a greedy request's drafts are accepted up
to that turn and rejected from it (a step keeping some of its drafts and not the rest)."""

from __future__ import annotations

import json
import random

import pytest

from folio import LLM, SamplingParams
from tests.conftest import TEST_DEVICE
from tests.executor.hybrid.checkpoints import assert_idle, make_hybrid_dir
from tests.hf_oracle import hf_greedy

pytestmark = pytest.mark.parity

NGRAM = json.dumps({"method": "ngram", "num_speculative_tokens": 3, "prompt_lookup_max": 2,
                    "prompt_lookup_min": 1, "max_running": 64})
SUFFIX = json.dumps({"method": "suffix", "num_speculative_tokens": 3, "max_running": 64,
                     "suffix_decoding_min_match_len": 1, "suffix_decoding_max_spec_factor": 2,
                     "suffix_decoding_max_cached_requests": 16})

_rng = random.Random(39)
PROMPTS = [[_rng.randrange(1, 1024) for _ in range(n)] for n in (9, 17, 30, 12)]
_PHRASE = [_rng.randrange(1, 1024) for _ in range(5)]
COPYING = [_PHRASE * 6, [5, 6, 7] * 9]   # n-gram lookup proposes from these
MAX_TOKENS = 20
# Seeded samples this cold stay on the greedy answer for a few tokens, then leave it.
NEAR_GREEDY = SamplingParams(temperature=0.05, seed=5, max_tokens=MAX_TOKENS)
GREEDY = SamplingParams(temperature=0.0, max_tokens=MAX_TOKENS)


@pytest.fixture(scope="module", params=["qwen3_5", "lfm2"])
def hybrid(request, tmp_path_factory, tokenizer_dir):
    path = make_hybrid_dir(tmp_path_factory.mktemp(request.param), tokenizer_dir,
                           request.param, seed=3)
    prompts = PROMPTS + COPYING
    return path, hf_greedy(path, prompts, [MAX_TOKENS] * len(prompts), TEST_DEVICE)


def _llm(model_dir, **engine_args):
    return LLM(str(model_dir), dtype="float32", device=TEST_DEVICE, num_kv_blocks=128,
               **engine_args)


def _tokens(llm, prompts, params):
    return [r.outputs[0].token_ids for r in llm.generate(prompts, [params] * len(prompts))]


def _drafts(stats):
    return (stats["spec_decode_num_draft_tokens"], stats["spec_decode_num_accepted_tokens"],
            stats["spec_decode_num_accepted_tokens_per_pos"])


def test_drafts_accepted_in_part_leave_the_state_exact(hybrid):
    model_dir, expected = hybrid
    assert _tokens(_llm(model_dir), PROMPTS, GREEDY) == expected[:len(PROMPTS)]   # spec off
    llm = _llm(model_dir, speculative_config=SUFFIX)
    _tokens(llm, PROMPTS, NEAR_GREEDY)   # fills the suffix cache
    before = _drafts(llm.stats())
    # One mixed batch: requests with drafts beside ones without, drafts of different
    # lengths, kept in part, in the same steps.
    assert _tokens(llm, PROMPTS, GREEDY) == expected[:len(PROMPTS)]
    stats = llm.stats()
    drafted, accepted, per_position = _drafts(stats)
    drafted, accepted = drafted - before[0], accepted - before[1]
    per_position = [a - b for a, b in zip(per_position, before[2])]
    assert 0 < accepted < drafted
    # Some step accepted its first draft and rejected a later one.
    assert per_position[0] > per_position[-1]
    assert_idle(stats)
    # Alone: a request's steps carry only its own drafts.
    llm = _llm(model_dir, speculative_config=SUFFIX)
    _tokens(llm, PROMPTS[:1], NEAR_GREEDY)
    assert _tokens(llm, PROMPTS[:1], GREEDY) == expected[:1]
    assert llm.stats()["spec_decode_num_accepted_tokens"] > 0
    assert_idle(llm.stats())


def test_ngram_drafts_from_copying_prompts(hybrid):
    model_dir, expected = hybrid
    llm = _llm(model_dir, speculative_config=NGRAM)
    assert _tokens(llm, PROMPTS + COPYING, GREEDY) == expected
    assert llm.stats()["spec_decode_num_draft_tokens"] > 0
    assert_idle(llm.stats())


def test_drafts_with_state_checkpoints_and_recompute_preemption(hybrid):
    """Checkpoints every block of 4 tokens (many fall on a step's verified token), then a
    pool so small that requests carrying drafts are preempted and recomputed."""
    model_dir, expected = hybrid
    for engine_args, counter in (({"hybrid_checkpoint_blocks": 1}, "state_checkpoints"),
                                 ({"num_kv_blocks": 14}, "preemptions_recompute")):
        llm = LLM(str(model_dir), dtype="float32", device=TEST_DEVICE,
                  speculative_config=SUFFIX, block_size=4, max_num_batched_tokens=16,
                  **{"num_kv_blocks": 128, **engine_args})
        _tokens(llm, PROMPTS, NEAR_GREEDY)
        before = llm.stats()[counter]
        assert _tokens(llm, PROMPTS, GREEDY) == expected[:len(PROMPTS)]
        stats = llm.stats()
        assert stats["spec_decode_num_accepted_tokens"] > 0
        assert stats[counter] > (before if counter == "preemptions_recompute" else 0)
        assert_idle(stats)
