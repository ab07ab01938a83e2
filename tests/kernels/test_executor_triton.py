"""The executor on the Triton kernels (interpreted on CPU): same greedy tokens as HF."""

from __future__ import annotations

import pytest

from folio import LLM, SamplingParams
from tests.conftest import TEST_DEVICE
from tests.hf_oracle import hf_greedy

pytestmark = pytest.mark.parity


@pytest.mark.parametrize("fixture", ["llama_dir", "qwen2_dir"])
def test_triton_backend_matches_transformers(fixture, request):
    model_dir = request.getfixturevalue(fixture)
    prompts = [[5, 9, 200, 31, 7, 7, 64], [100] * 21, [3]]
    max_tokens = [4, 3, 5]
    # Small blocks and budget: decodes and prompt chunks with earlier context share launches.
    llm = LLM(str(model_dir), dtype="float32", device=TEST_DEVICE, attention_backend="triton",
              block_size=4, num_kv_blocks=64, max_num_batched_tokens=9)
    assert llm.engine.executor.ops.name == "triton"
    results = llm.generate(prompts, [SamplingParams(temperature=0, max_tokens=n)
                                     for n in max_tokens])
    assert [r.outputs[0].token_ids for r in results] == hf_greedy(model_dir, prompts,
                                                                  max_tokens, TEST_DEVICE)


def test_triton_backend_past_a_sliding_window(tmp_path_factory, tokenizer_dir):
    """A Mistral with a 6-token window and prompts past it: the windowed kernel, and the
    scheduler freeing blocks behind the window (12 blocks of 4, one the null block)."""
    from tests.conftest import _model_dir

    model_dir = _model_dir(tmp_path_factory, tokenizer_dir, "mistral_w6", arch="mistral",
                           num_heads=4, num_kv_heads=2, head_dim=16, hidden_size=64,
                           num_layers=2, sliding_window=6, max_position_embeddings=128)
    prompts = [[5, 9, 200, 31, 7, 7, 64, 8, 19, 44], [100] * 21, [3]]
    max_tokens = [6, 4, 5]
    llm = LLM(str(model_dir), dtype="float32", device=TEST_DEVICE, attention_backend="triton",
              block_size=4, num_kv_blocks=12, max_num_batched_tokens=9)
    assert llm.engine.scheduler.config.sliding_window == 6
    results = llm.generate(prompts, [SamplingParams(temperature=0, max_tokens=n)
                                     for n in max_tokens])
    assert [r.outputs[0].token_ids for r in results] == hf_greedy(model_dir, prompts,
                                                                  max_tokens, TEST_DEVICE)
    assert llm.stats()["kv_blocks_free"] == 11


@pytest.mark.parametrize("kv_cache_dtype", ["int8"])   # float8: the kernel tests' oracle
def test_triton_backend_on_a_quantized_cache(llama_dir, kv_cache_dtype):
    """The Triton write quantizes as the torch path does (bit for bit) and attention reads
    the blocks in place: the same greedy tokens as the torch backend on the same cache."""
    prompts = [[5, 9, 200, 31, 7, 7, 64], [100] * 21, [3]]
    params = [SamplingParams(temperature=0, max_tokens=n) for n in (4, 3, 5)]
    tokens = {}
    for backend in ("triton", "torch"):
        llm = LLM(str(llama_dir), dtype="float32", device=TEST_DEVICE,
                  attention_backend=backend, kv_cache_dtype=kv_cache_dtype, block_size=4,
                  num_kv_blocks=64, max_num_batched_tokens=9)
        assert llm.engine.executor.kv_dtype.itemsize == 1
        free = llm.stats()["kv_blocks_free"]
        tokens[backend] = [r.outputs[0].token_ids for r in llm.generate(prompts, params)]
        assert llm.stats()["kv_blocks_free"] == free
    assert tokens["triton"] == tokens["torch"]
