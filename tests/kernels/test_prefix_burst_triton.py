"""Same-step prefix sharing on the Triton kernels (interpreted on CPU): a request reads
blocks that another row of the same step writes, after reshape_and_cache wrote them."""

from __future__ import annotations

import pytest

from folio import LLM, SamplingParams
from tests.conftest import TEST_DEVICE
from tests.hf_oracle import hf_greedy

pytestmark = pytest.mark.parity


def test_burst_shares_blocks_written_in_the_same_step(llama_dir):
    prefix = [5, 9, 200, 31, 7, 7, 64, 12, 900, 4, 4, 18]
    prompts = [prefix + [100], prefix + [3, 77], prefix + [41, 41, 8]]
    max_tokens = [4, 3, 5]
    llm = LLM(str(llama_dir), dtype="float32", device=TEST_DEVICE, attention_backend="triton",
              block_size=4, num_kv_blocks=64)
    engine = llm.engine
    for i, (prompt, n) in enumerate(zip(prompts, max_tokens)):
        engine.add_request(f"p{i}", prompt, SamplingParams(temperature=0, max_tokens=n))
    tokens = {f"p{i}": [] for i in range(len(prompts))}
    outputs = engine.step()
    assert engine.stats()["prefix_cache_hits"] == 2 * len(prefix)   # in the first step
    while True:
        for output in outputs:
            tokens[output.request_id].extend(output.new_token_ids)
        if not engine.has_unfinished_requests():
            break
        outputs = engine.step()
    assert list(tokens.values()) == hf_greedy(llama_dir, prompts, max_tokens, TEST_DEVICE)
