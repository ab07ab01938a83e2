"""Gemma 4's text decoder: greedy output token-identical to transformers in float32 on tiny
random checkpoints (with and without KV sharing, values = keys, per-layer inputs), each
prompt alone, in a mixed batch whose long prompts are chunked, and with a prefix hit; every
block free when idle; the native decode step stands aside and says why."""

from __future__ import annotations

import pytest

from folio import LLM, SamplingParams
from tests.conftest import TEST_DEVICE
from tests.executor.gemma4.checkpoints import VARIANTS, make_gemma4_dir
from tests.hf_oracle import hf_greedy, random_prompts

pytestmark = pytest.mark.parity

# Lengths 1..60 (the sliding layers' window is 16), up to 10 new tokens each.
PROMPTS, _LONGER = random_prompts(5, 1, 60, vocab=1024, seed=4)
MAX_TOKENS = [min(n, 10) for n in _LONGER]
# Two turns of one conversation: the second shares the first's 50 leading tokens.
_SHARED = random_prompts(2, 50, 50, vocab=1024, seed=5)[0][0]
TURNS = [_SHARED + [11, 12, 13], _SHARED + [21, 22, 23, 24, 25]]


@pytest.fixture(scope="module", params=list(VARIANTS))
def gemma4(request, tmp_path_factory, tokenizer_dir):
    path = make_gemma4_dir(tmp_path_factory.mktemp(request.param), tokenizer_dir,
                           request.param)
    expected = hf_greedy(path, PROMPTS + TURNS, MAX_TOKENS + [8, 8], TEST_DEVICE)
    return path, expected[:len(PROMPTS)], expected[len(PROMPTS):]


def _assert_idle(llm):
    stats = llm.stats()
    assert stats["kv_blocks_free"] == stats["kv_blocks_total"]
    assert stats["num_running"] == stats["num_waiting"] == 0


def test_greedy_matches_transformers_alone_batched_and_with_a_prefix_hit(gemma4, caplog):
    model_dir, expected, turns = gemma4
    assert len({t for answer in expected for t in answer}) > 10   # not one repeated token
    params = [SamplingParams(temperature=0.0, max_tokens=n) for n in MAX_TOKENS]
    with caplog.at_level("INFO", logger="folio.executor"):
        llm = LLM(str(model_dir), dtype="float32", device=TEST_DEVICE, num_kv_blocks=128,
                  max_num_batched_tokens=32)
    if TEST_DEVICE == "cpu":
        assert "decode step: Python layers (Gemma 4 layers" in caplog.text
    # Alone: the longest prompt (past the window) and the shortest.
    for i in (1, 0):
        assert llm.generate([PROMPTS[i]], params[i])[0].outputs[0].token_ids == expected[i]
    # Mixed: all at once, 32 tokens a step, so the long prompts are chunked beside decodes.
    assert [r.outputs[0].token_ids for r in llm.generate(PROMPTS, params)] == expected
    _assert_idle(llm)
    # A prefix hit: the second turn takes its first 3 blocks (48 tokens) from the cache.
    turn = SamplingParams(temperature=0.0, max_tokens=8)
    hits = llm.stats()["prefix_cache_hits"]
    assert [llm.generate([t], turn)[0].outputs[0].token_ids for t in TURNS] == turns
    assert llm.stats()["prefix_cache_hits"] - hits >= 48
    _assert_idle(llm)
