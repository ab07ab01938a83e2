"""Swap preemption on hybrid models: a preempted request's recurrent state goes to a host
state slot with its KV blocks and comes back exactly. Greedy output token-identical to
transformers in float32 under forced swap preemption (a pool too small for the batch, the
swaps counted in the stats), with speculative drafts in flight too; every block and state
slot, on the device and on the host, free when idle."""

from __future__ import annotations

import json

import pytest

from folio import LLM, SamplingParams
from tests.conftest import TEST_DEVICE
from tests.executor.hybrid.checkpoints import make_hybrid_dir
from tests.hf_oracle import hf_greedy, random_prompts

pytestmark = pytest.mark.parity

PROMPTS, _LONGER = random_prompts(6, 1, 60, vocab=1024, seed=41)
MAX_TOKENS = [min(n, 12) + 4 for n in _LONGER]
SUFFIX = json.dumps({"method": "suffix", "num_speculative_tokens": 3, "max_running": 64,
                     "suffix_decoding_min_match_len": 1,
                     "suffix_decoding_max_cached_requests": 16})


@pytest.fixture(scope="module", params=["qwen3_5", "lfm2"])
def hybrid(request, tmp_path_factory, tokenizer_dir):
    path = make_hybrid_dir(tmp_path_factory.mktemp(request.param), tokenizer_dir,
                           request.param)
    return path, hf_greedy(path, PROMPTS, MAX_TOKENS, TEST_DEVICE)


def _assert_idle(stats):
    assert stats["kv_blocks_free"] == stats["kv_blocks_total"]
    assert stats["swap_blocks_free"] == stats["swap_blocks_total"] > 0
    assert stats["state_slots_used"] == 0 and stats["state_slots_total"] > 0
    assert stats["swap_state_slots_free"] == stats["swap_state_slots_total"] > 0
    assert stats["num_running"] == stats["num_waiting"] == stats["num_swapped"] == 0


@pytest.mark.parametrize("spec", [None, SUFFIX], ids=["plain", "drafts"])
def test_greedy_identical_under_swap_preemption(hybrid, spec):
    model_dir, expected = hybrid
    # 20 blocks of 4 tokens, 16 tokens a step: running requests are swapped out (state
    # and blocks) and back in; none is recomputed.
    llm = LLM(str(model_dir), dtype="float32", device=TEST_DEVICE, num_kv_blocks=20,
              block_size=4, max_num_batched_tokens=16, preemption_mode="swap",
              speculative_config=spec)
    params = [SamplingParams(temperature=0.0, max_tokens=n) for n in MAX_TOKENS]
    assert [r.outputs[0].token_ids for r in llm.generate(PROMPTS, params)] == expected
    stats = llm.stats()
    assert stats["preemptions_swap"] > 0 and stats["preemptions_recompute"] == 0
    _assert_idle(stats)
