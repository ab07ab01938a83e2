"""Gemma 4 on the Triton kernels (interpreted on CPU): each layer's cache has its own head
size and KV heads, and kv-shared layers read
an earlier layer's blocks; the same greedy tokens as transformers, and on an int8 cache the
same as the torch backend on that cache."""

from __future__ import annotations

import pytest

from folio import LLM, SamplingParams
from tests.conftest import TEST_DEVICE
from tests.executor.gemma4.checkpoints import make_gemma4_dir
from tests.hf_oracle import hf_greedy

pytestmark = pytest.mark.parity

PROMPTS = [[5, 9, 200, 31, 7, 7, 64, 8, 19, 44] * 2, [100] * 21, [3]]
MAX_TOKENS = [6, 4, 5]


def test_triton_backend_runs_gemma4_layers_of_their_own_shapes(tmp_path, tokenizer_dir):
    # One variant (the interpreter is slow): kv-shared layers and per-layer shapes are what
    # the kernels see; values = keys (k_eq_v) is the same cache write (tests/executor/gemma4).
    model_dir = make_gemma4_dir(tmp_path, tokenizer_dir, "shared_kv_ple")
    params = [SamplingParams(temperature=0, max_tokens=n) for n in MAX_TOKENS]
    # Small blocks and budget: decodes and prompt chunks with earlier context share launches.
    llm = LLM(str(model_dir), dtype="float32", device=TEST_DEVICE, attention_backend="triton",
              block_size=4, num_kv_blocks=64, max_num_batched_tokens=9)
    assert llm.engine.executor.ops.name == "triton"
    assert [r.outputs[0].token_ids for r in llm.generate(PROMPTS, params)] == hf_greedy(
        model_dir, PROMPTS, MAX_TOKENS, TEST_DEVICE)
    tokens = {}
    for backend in ("triton", "torch"):
        quantized = LLM(str(model_dir), dtype="float32", device=TEST_DEVICE,
                        attention_backend=backend, kv_cache_dtype="int8", block_size=4,
                        num_kv_blocks=64, max_num_batched_tokens=9)
        tokens[backend] = [r.outputs[0].token_ids for r in quantized.generate(PROMPTS, params)]
    assert tokens["triton"] == tokens["torch"]
