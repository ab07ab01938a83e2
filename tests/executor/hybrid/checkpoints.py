"""Tiny random Qwen3.5 and LFM2 checkpoints, made by transformers itself, with the shared
test tokenizer: a few layers mixing recurrent and attention layers."""

from __future__ import annotations

import shutil
from pathlib import Path

from tests.conftest import TOKENIZER_FILES

QWEN3_5 = dict(
    hidden_size=64, intermediate_size=128, num_attention_heads=4, num_key_value_heads=2,
    head_dim=16, linear_num_key_heads=2, linear_num_value_heads=4, linear_key_head_dim=16,
    linear_value_head_dim=8, linear_conv_kernel_dim=4,
    layer_types=["linear_attention", "full_attention", "linear_attention"],
    rope_parameters={"rope_type": "default", "rope_theta": 10000.0,
                     "partial_rotary_factor": 0.5, "mrope_section": [2, 1, 1]})
LFM2 = dict(
    hidden_size=64, intermediate_size=128, num_attention_heads=4, num_key_value_heads=2,
    conv_L_cache=3, block_multiple_of=16,
    layer_types=["conv", "full_attention", "conv"])


def make_hybrid_dir(path: Path, tokenizer_dir: Path, family: str, seed: int = 0,
                    **overrides) -> Path:
    """`overrides`: config fields over the family's (LFM2's conv_bias, say)."""
    import torch
    import transformers as hf

    for file in TOKENIZER_FILES:
        if (tokenizer_dir / file).exists():
            shutil.copy(tokenizer_dir / file, path / file)
    fields = {**(QWEN3_5 if family == "qwen3_5" else LFM2), **overrides}
    config_cls, model_cls = ((hf.Qwen3_5TextConfig, hf.Qwen3_5ForCausalLM)
                             if family == "qwen3_5" else (hf.Lfm2Config, hf.Lfm2ForCausalLM))
    config = config_cls(vocab_size=1024, num_hidden_layers=len(fields["layer_types"]),
                        max_position_embeddings=1024, tie_word_embeddings=False,
                        initializer_range=0.1, bos_token_id=None, eos_token_id=0,
                        pad_token_id=0, **fields)
    torch.manual_seed(seed)
    model = model_cls(config)
    with torch.no_grad():   # norms start constant: perturbed, so a misplaced one shows
        for name, param in model.named_parameters():
            if name.endswith("norm.weight"):
                param.add_(torch.randn_like(param) * 0.2)
    model.save_pretrained(str(path), safe_serialization=True)
    return path


def assert_idle(stats: dict) -> None:
    """Nothing running or waiting, and every block and state slot free."""
    assert stats["kv_blocks_free"] == stats["kv_blocks_total"]
    assert stats["state_slots_used"] == 0 and stats["state_slots_total"] > 0
    assert stats["num_running"] == stats["num_waiting"] == 0


def assert_native_decode_step(llm) -> None:
    """On the CPU with the C++ kernel set built, the engine's decode-only steps run the
    native hybrid step (executor/native_step/hybrid.py), so the parity tests check it."""
    from folio.kernels import cpu_attention
    from tests.conftest import TEST_DEVICE

    if TEST_DEVICE == "cpu" and cpu_attention.load().ok:
        assert llm.engine.executor.model.native_step is not None


def _runs_cpp_prompts(llm) -> bool:
    """On the CPU with the C++ kernel set built, a model with Gated DeltaNet layers runs
    their prompts in C++ (kernels/cpu/gated_delta_chunk.cpp)."""
    from folio.executor.models.hybrid.layers import GatedDeltaNet
    from folio.kernels import cpu_attention
    from tests.conftest import TEST_DEVICE

    model = llm.engine.executor.model
    has_delta = any(isinstance(m, GatedDeltaNet) for m in model.modules())
    return TEST_DEVICE == "cpu" and cpu_attention.load().ok and has_delta


def two_turns(seed: int) -> list[list[int]]:
    """Two turns of one conversation: the second shares the first's 140 leading tokens."""
    from tests.hf_oracle import random_prompts

    shared = random_prompts(2, 140, 140, vocab=1024, seed=seed)[0][0]
    return [shared + [11, 12, 13], shared + [21, 22, 23, 24, 25]]


def assert_resumes_from_a_checkpoint(model_dir: Path, turns: list[list[int]],
                                     expected: list[list[int]]) -> None:
    """Checkpoints every 4 blocks of 16 tokens: the second turn shares 140 tokens, so it
    takes 128 from the cache (the blocks and the state after them) and computes the rest,
    with transformers' tokens (`expected`, 8 per turn)."""
    import torch

    from folio import LLM, SamplingParams
    from tests.conftest import TEST_DEVICE

    llm = LLM(str(model_dir), dtype="float32", device=TEST_DEVICE, num_kv_blocks=64,
              hybrid_checkpoint_blocks=4)
    params = SamplingParams(temperature=0.0, max_tokens=8)
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
        first = llm.generate([turns[0]], [params])[0].outputs[0].token_ids
        assert llm.stats()["prefix_cache_hits"] == 0
        second = llm.generate([turns[1]], [params])[0].outputs[0].token_ids
    assert [first, second] == expected
    if _runs_cpp_prompts(llm):   # the checkpoints were written by the C++ prompt kernel
        assert "folio::gated_delta_prompt" in {event.key for event in prof.key_averages()}
    stats = llm.stats()
    assert stats["prefix_cache_hits"] == 128
    assert stats["state_checkpoints"] >= 2 and stats["state_slots_used"] == 0
    assert stats["kv_blocks_free"] == stats["kv_blocks_total"]
