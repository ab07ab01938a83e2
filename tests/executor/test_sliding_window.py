"""A Mistral checkpoint past its sliding window: greedy output token-identical to
transformers on the torch and cpu backends, while the scheduler frees the blocks that left
the window (so a pool smaller than the longest request still serves it); the executor's
hello says the window only when every layer has one."""

from __future__ import annotations

import pytest

from folio.executor.executor import kv_window
from folio.executor.models.hf_config import parse_model_config
from folio import LLM, SamplingParams
from folio.kernels import cpu_attention
from folio.shared.protocol import messages as m
from folio.shared.config import ExecutorCapacity
from folio.shared.protocol.wire import Body
from tests.conftest import TEST_DEVICE, _model_dir
from tests.hf_oracle import hf_greedy, random_prompts

WINDOW = 24
# Prompts up to 200 tokens, far past the window; the oracle is transformers' own mask.
PROMPTS, MAX_TOKENS = random_prompts(8, 1, 200, vocab=1024, seed=77)


@pytest.fixture(scope="module")
def windowed_mistral(tmp_path_factory, tokenizer_dir):
    model_dir = _model_dir(tmp_path_factory, tokenizer_dir, "mistral_window", arch="mistral",
                           num_heads=4, num_kv_heads=2, head_dim=16, hidden_size=64,
                           num_layers=2, sliding_window=WINDOW, max_position_embeddings=512)
    return model_dir, hf_greedy(model_dir, PROMPTS, MAX_TOKENS, TEST_DEVICE)


def _greedy(model_dir, **engine_args):
    llm = LLM(str(model_dir), dtype="float32", device=TEST_DEVICE, **engine_args)
    results = llm.generate(PROMPTS, [SamplingParams(temperature=0.0, max_tokens=n)
                                     for n in MAX_TOKENS])
    return [r.outputs[0].token_ids for r in results], llm


@pytest.mark.parity
@pytest.mark.parametrize("backend, engine_args", [
    ("torch", dict(num_kv_blocks=512)),
    # 12 blocks of 16 (one the null block): less than the longest request's 240 tokens;
    # small blocks and chunks put decodes and windowed chunks in one call.
    ("cpu", dict(num_kv_blocks=12, max_num_batched_tokens=32)),
    ("torch", dict(block_size=4, num_kv_blocks=40, max_num_batched_tokens=13,
                   max_num_seqs=3)),
], ids=["torch-roomy", "cpu-pool-below-longest", "torch-b4-chunks"])
def test_past_the_window_matches_transformers(windowed_mistral, backend, engine_args):
    if backend == "cpu":
        if TEST_DEVICE != "cpu":
            pytest.skip("the cpu backend runs on the CPU")
        if not cpu_attention.load().ok:   # setup.sh builds it; build it here if missing
            cpu_attention.build()
    model_dir, expected = windowed_mistral
    outputs, llm = _greedy(model_dir, attention_backend=backend, **engine_args)
    assert llm.engine.executor.ops.name == backend
    assert llm.engine.executor.capacity.sliding_window == WINDOW
    config = llm.engine.scheduler.config
    longest = max(len(p) + n for p, n in zip(PROMPTS, MAX_TOKENS))
    assert config.max_request_len == 512
    if engine_args["num_kv_blocks"] * config.block_size < longest:
        assert config.usable_kv_blocks * config.block_size < longest
    assert outputs == expected
    stats = llm.stats()
    assert stats["kv_blocks_free"] == stats["kv_blocks_total"] == engine_args["num_kv_blocks"] - 1


def test_hello_carries_the_window():
    capacity = ExecutorCapacity(num_kv_blocks=8, block_size=16, max_model_len=512,
                                vocab_size=1024, eos_token_ids=(0,), sliding_window=WINDOW)
    for sent, seen in ((capacity, WINDOW), (ExecutorCapacity(8, 16, 512, 1024, (0,)), None)):
        msg_type, body = m.decode(m.encode_hello_executor(sent, 7), {"executor_hello"})
        assert msg_type == "executor_hello"
        assert m.decode_hello_executor(body)[0].sliding_window == seen
    # An older executor's hello without the field: no window.
    fields = m.unpack(m.encode_hello_executor(capacity, 7))[1]
    del fields["sliding_window"]
    assert m.decode_hello_executor(Body("executor_hello", fields))[0].sliding_window is None


def test_the_window_is_reported_only_when_every_layer_has_one():
    base = dict(architecture="MistralForCausalLM", hidden_size=64, num_hidden_layers=3,
                num_attention_heads=4, num_key_value_heads=2, intermediate_size=128,
                vocab_size=1024, max_position_embeddings=512, rms_norm_eps=1e-6)
    mistral = parse_model_config({**base, "architectures": ["MistralForCausalLM"],
                                "sliding_window": 100})
    assert kv_window(mistral, 512) == 100
    assert kv_window(mistral, 100) is None          # the window excludes nothing there
    gemma3 = parse_model_config({
        **base, "architectures": ["Gemma3ForCausalLM"], "head_dim": 16, "sliding_window": 100,
        "layer_types": ["sliding_attention", "full_attention", "sliding_attention"]})
    assert gemma3.layer_windows == (100, None, 100)
    assert kv_window(gemma3, 512) is None           # a global layer reads everything
    llama = parse_model_config({**base, "architectures": ["LlamaForCausalLM"]})
    assert kv_window(llama, 512) is None
