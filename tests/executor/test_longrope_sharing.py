"""Phi-3's longrope switch rewrites a crossing sequence's cached KV in place, so the executor
says so in its hello and the scheduler then shares no block through the prefix cache: two
prompts with a common prefix, one long from the start (long factors) and one that crosses
the original length while decoding (short factors first), both match transformers."""

from __future__ import annotations

import random

import pytest

from folio import LLM, SamplingParams
from folio.shared.protocol import messages as m
from folio.shared.config import ExecutorCapacity
from tests.conftest import TEST_DEVICE, _model_dir
from tests.hf_oracle import hf_greedy
from tests.executor.test_models_parity import ARCHS

pytestmark = pytest.mark.parity


def test_prompts_sharing_a_prefix_across_the_switch_match_transformers(
        tmp_path_factory, tokenizer_dir):
    model_dir = _model_dir(tmp_path_factory, tokenizer_dir, "phi3_sharing", **ARCHS["phi3"])
    rng = random.Random(7)
    prefix = [rng.randrange(3, 1024) for _ in range(56)]   # three full blocks of 16
    prompts = [prefix + [rng.randrange(3, 1024) for _ in range(20)],   # 76 > 64: long
               prefix + [rng.randrange(3, 1024) for _ in range(4)]]    # 60: crosses at 64
    max_tokens = [6, 12]
    expected = hf_greedy(model_dir, prompts, max_tokens, TEST_DEVICE)
    llm = LLM(str(model_dir), dtype="float32", device=TEST_DEVICE, num_kv_blocks=64,
              block_size=16)
    results = llm.generate(prompts, [SamplingParams(temperature=0.0, max_tokens=n)
                                     for n in max_tokens])
    assert [r.outputs[0].token_ids for r in results] == expected
    assert llm.stats()["prefix_cache_hits"] == 0   # the scheduler shared nothing


def test_hello_carries_rewrites_kv():
    for flag in (True, False):
        capacity = ExecutorCapacity(8, 16, 512, 1024, (0,), rewrites_kv=flag)
        body = m.decode(m.encode_hello_executor(capacity, 7), {"executor_hello"})[1]
        assert m.decode_hello_executor(body)[0].rewrites_kv is flag
