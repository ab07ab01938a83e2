"""Multi-step decoding on hybrid models (docs/multi_step.md): each extra pass of a burst is
an ordinary decode step of the recurrent state, so greedy output stays token-identical to
transformers in float32 on tiny random Qwen3.5 and LFM2 checkpoints, in a mixed batch, with
state checkpoints every block, and under recompute and swap preemption; every block and
state slot free when idle."""

from __future__ import annotations

import random

import pytest

from folio import LLM, SamplingParams
from tests.conftest import TEST_DEVICE
from tests.executor.hybrid.checkpoints import assert_idle, make_hybrid_dir
from tests.hf_oracle import hf_greedy

pytestmark = pytest.mark.parity

_rng = random.Random(41)
PROMPTS = [[_rng.randrange(1, 1024) for _ in range(n)] for n in (9, 17, 30, 12)]
MAX_TOKENS = 19   # not a multiple of the burst: the last one is cut short
GREEDY = SamplingParams(temperature=0.0, max_tokens=MAX_TOKENS)


@pytest.fixture(scope="module", params=["qwen3_5", "lfm2"])
def hybrid(request, tmp_path_factory, tokenizer_dir):
    path = make_hybrid_dir(tmp_path_factory.mktemp(request.param), tokenizer_dir,
                           request.param, seed=5)
    return path, hf_greedy(path, PROMPTS, [MAX_TOKENS] * len(PROMPTS), TEST_DEVICE)


@pytest.mark.parametrize("engine_args", [
    {"num_kv_blocks": 128},
    {"num_kv_blocks": 128, "hybrid_checkpoint_blocks": 1},
    {"num_kv_blocks": 14},
    {"num_kv_blocks": 14, "preemption_mode": "swap", "num_swap_blocks": 64},
], ids=["roomy", "checkpoints", "recompute", "swap"])
def test_bursts_match_transformers(hybrid, engine_args):
    model_dir, expected = hybrid
    llm = LLM(str(model_dir), dtype="float32", device=TEST_DEVICE, num_scheduler_steps=4,
              block_size=4, max_num_batched_tokens=16, **engine_args)
    got = [r.outputs[0].token_ids for r in llm.generate(PROMPTS, [GREEDY] * len(PROMPTS))]
    assert got == expected
    stats = llm.stats()
    assert stats["multi_step_extra_tokens"] > 0
    if engine_args["num_kv_blocks"] == 14:
        assert stats["preemptions_recompute"] + stats["preemptions_swap"] > 0
    assert_idle(stats)
