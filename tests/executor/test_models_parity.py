"""Qwen3, Qwen3-MoE, Mixtral, Phi-3, Gemma 2, Gemma 3, SmolLM3, OLMo 3 and gpt-oss: greedy output token-identical to
transformers on tiny random checkpoints that transformers itself made, with a roomy pool and
with one small enough to preempt."""

from __future__ import annotations

import pytest

from folio import LLM, SamplingParams
from tests.conftest import TEST_DEVICE, _model_dir
from tests.hf_oracle import hf_greedy, random_prompts

pytestmark = pytest.mark.parity

PROMPTS, MAX_TOKENS = random_prompts(16, 1, 300, vocab=1024, seed=1234)

_SLIDING, _FULL = "sliding_attention", "full_attention"
# Longrope factors for a rotary dimension of 8 (head_dim 16, partial_rotary_factor 0.5).
_LONGROPE = {"rope_type": "longrope", "rope_theta": 10000.0, "partial_rotary_factor": 0.5,
             "short_factor": [1.0, 1.3, 2.0, 1.5], "long_factor": [1.0, 4.0, 8.0, 6.0]}

_YARN = {"rope_type": "yarn", "factor": 16.0, "original_max_position_embeddings": 64,
         "beta_fast": 8.0, "beta_slow": 1.0}

# Tiny shapes; each exercises what sets its architecture apart. The Gemma windows (64, 48)
# are shorter than most prompts, so local layers attend only the window's keys.
ARCHS = {
    # One layer where a second adds nothing the others do not cover (test time).
    "qwen3": dict(arch="qwen3", num_layers=1, num_kv_heads=1),
    # bfloat16 on disk: the loader upcasts it; transformers reads the same file.
    "qwen3_moe": dict(arch="qwen3_moe", num_experts=8, num_experts_per_tok=3,
                      moe_intermediate_size=32, norm_topk_prob=False, mlp_only_layers=[1],
                      dtype="bfloat16"),
    "mixtral": dict(arch="mixtral", num_layers=1, num_local_experts=4, num_experts_per_tok=2,
                    intermediate_size=64),
    # Original length 64 (attention factor from 1024 / 64): short prompts stay short, long
    # ones are long throughout, two prompts (43 and 60 tokens) cross it while decoding and,
    # with the small pool, long prompts cross it between prefill chunks.
    # Two layers: the second layer's keys depend on the first's rope, as the recompute must.
    "phi3": dict(arch="phi3", original_max_position_embeddings=64, rope_parameters=_LONGROPE),
    "gemma2": dict(arch="gemma2", sliding_window=64, attn_logit_softcapping=5.0,
                   final_logit_softcapping=3.0, query_pre_attn_scalar=24),
    # Tied, as Gemma checkpoints are; a small init keeps the scaled embedding from making
    # the tied head repeat the input token (the answers would say little).
    "gemma3": dict(arch="gemma3", sliding_window=48, layer_types=[_SLIDING, _FULL],
                   query_pre_attn_scalar=16, tie_word_embeddings=True, initializer_range=0.02,
                   rope_parameters={_FULL: {"rope_type": "linear", "factor": 2.0,
                                            "rope_theta": 1e6},
                                    _SLIDING: {"rope_type": "default", "rope_theta": 1e4}}),
    # The second layer without rotary (no_rope_layers 0).
    "smollm3": dict(arch="smollm3", no_rope_layers=[1, 0], tie_word_embeddings=False),
    # A sliding layer (window 48) then a global one with YaRN (original length 64, so most
    # prompts run past it); q/k norms over all heads, norms after each sublayer.
    "olmo3": dict(arch="olmo3", sliding_window=48, layer_types=[_SLIDING, _FULL],
                  rope_parameters={_FULL: dict(_YARN, rope_theta=1e4),
                                   _SLIDING: {"rope_type": "default", "rope_theta": 1e4}}),
    # Sliding (window 32) and full layers with sinks, YaRN without truncation, biased
    # experts with the clamped SwiGLU (a small limit, so the clamp bites). A wider init: the
    # default's answers repeat a few tokens.
    "gpt_oss": dict(arch="gpt_oss", sliding_window=32, layer_types=[_SLIDING, _FULL],
                    num_local_experts=4, num_experts_per_tok=2, intermediate_size=32,
                    swiglu_limit=2.0, initializer_range=0.2, rope_parameters=dict(_YARN, truncate=False,
                                                           rope_theta=1e4)),
}


def _greedy(model_dir, **engine_args) -> tuple[list[list[int]], dict]:
    llm = LLM(str(model_dir), dtype="float32", device=TEST_DEVICE, **engine_args)
    params = [SamplingParams(temperature=0.0, max_tokens=n) for n in MAX_TOKENS]
    results = llm.generate(PROMPTS, params)
    return [r.outputs[0].token_ids for r in results], llm.stats()


@pytest.mark.parametrize("arch", ARCHS)
def test_greedy_matches_transformers(arch, tmp_path_factory, tokenizer_dir):
    model_dir = _model_dir(tmp_path_factory, tokenizer_dir, arch, **ARCHS[arch])
    expected = hf_greedy(model_dir, PROMPTS, MAX_TOKENS, TEST_DEVICE)
    # A random model that repeats one token would match almost anything: it must not.
    assert len({token for answer in expected for token in answer}) > 100
    outputs, stats = _greedy(model_dir, num_kv_blocks=2048)
    assert outputs == expected
    assert stats["preemptions_recompute"] == 0
    # 24 blocks of 16 tokens: the longest request just fits alone, so requests queue for
    # memory and running ones are preempted and recomputed.
    outputs, stats = _greedy(model_dir, num_kv_blocks=24, max_num_batched_tokens=128)
    assert outputs == expected
    assert stats["preemptions_recompute"] > 0
    assert stats["kv_blocks_free"] == stats["kv_blocks_total"] == 24
