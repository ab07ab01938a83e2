"""GGUF files of LFM2, Qwen3.5, Qwen3.5-MoE and LFM2-MoE (executor/quantization/gguf/hybrid/),
written here from tiny random transformers checkpoints the way llama.cpp's converter writes them
(gguf_writer.py: its names, metadata and transforms; the Qwen3.5 file with fewer key heads
than value heads, so the value heads are reordered, and with a multi-token-prediction
block): the F32 file reads as the checkpoint's config, its tensors come back as the
checkpoint's (bit for bit, a zero-centred norm as its stored 1 + weight), and Folio's greedy
output is token-identical to transformers on the source checkpoint; a Q8_0 file runs its
linears kept quantized (the experts dequantized) and gives the logits of the
same file dequantized; malformed files are refused by name before anything starts."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from folio import LLM, SamplingParams
from tests.executor.hybrid.checkpoints import assert_idle, make_hybrid_dir
from tests.executor.hybrid.gguf_writer import (RECURRENT_LAYERS, read_config, split_qkvz,
                                               write_hybrid_gguf)
from tests.executor.hybrid.moe_checkpoints import make_moe_dir
from tests.executor.quantization.gguf_checks import (greedy_matches_checkpoint,
                                                    kept_and_dequantized_agree, linear_kinds,
                                                    model_refusal)
from tests.hf_oracle import hf_greedy, random_prompts

PROMPTS, _ = random_prompts(4, 1, 70, vocab=1024, seed=41)
MAX_TOKENS = 10
# GGUF names of the file each family's F32 test writes
ARCH = {"qwen3_5": "qwen35", "lfm2": "lfm2", "qwen3_5_moe": "qwen35moe", "lfm2_moe": "lfm2moe",
        "qwen3_next": "qwen3next"}
# What llama.cpp's converter cannot write, left out of the MoE checkpoints (the released
# ones have none of it): LFM2-MoE's routed scaling and an untied lm_head; Qwen3-Next's
# dense layers and unnormalised top-k.
AS_RELEASED = {"qwen3_5_moe": {},
               "lfm2_moe": {"routed_scaling_factor": 1.0, "tie_word_embeddings": True},
               "qwen3_next": {"mlp_only_layers": [], "norm_topk_prob": True}}
# The linears a Q8_0 file keeps quantized (by module name): Qwen3.5's out_proj has its
# value-head columns reordered across its blocks (float); the MoE MLPs are the shared
# expert's (its down_proj rows of 48 are F16 in the file) and the experts (dequantized);
# Qwen3-Next's fused in_proj_ba is split at load (float).
_QWEN = {"in_proj_qkv", "in_proj_z", "q_proj", "k_proj", "v_proj", "o_proj", "lm_head",
         "gate_proj", "up_proj"}
_LFM2 = {"in_proj", "out_proj", "q_proj", "k_proj", "v_proj", "w1", "w2", "w3", "lm_head"}
KEPT = {"qwen3_5": _QWEN | {"in_proj_a", "in_proj_b", "down_proj"},
        "qwen3_5_moe": _QWEN | {"in_proj_a", "in_proj_b"},
        "qwen3_next": _QWEN | {"out_proj"},
        "lfm2": _LFM2, "lfm2_moe": _LFM2}


@pytest.fixture(scope="module", params=list(ARCH))
def hybrid(request, tmp_path_factory, tokenizer_dir):
    family = request.param
    path = tmp_path_factory.mktemp(family)
    if family in AS_RELEASED:
        model_dir = make_moe_dir(path, tokenizer_dir, family, **AS_RELEASED[family])
    else:
        model_dir = make_hybrid_dir(path, tokenizer_dir, family)
    files = tmp_path_factory.mktemp(f"{family}_gguf")
    f32 = write_hybrid_gguf(model_dir, files / "model-F32.gguf",
                            mtp_block=family == "qwen3_5")
    q8 = write_hybrid_gguf(model_dir, files / "model-Q8_0.gguf", "Q8_0")
    return family, model_dir, f32, q8


def test_the_file_reads_as_its_checkpoint(hybrid):
    from safetensors.torch import load_file

    from folio.executor.models.hf_config import read_model_config
    from folio.executor.weights import iterate_weights

    family, model_dir, f32, _ = hybrid
    assert read_model_config(f32) == read_model_config(model_dir)
    checkpoint = load_file(str(model_dir / "model.safetensors"))
    for name in [name for name in checkpoint if name.endswith("in_proj_qkvz.weight")]:
        # Qwen3-Next's: the file holds it split (the loader splits the checkpoint's alike)
        checkpoint.update(split_qkvz(name, checkpoint.pop(name), read_config(model_dir)))
    loaded = dict(iterate_weights(f32))
    assert loaded.keys() == checkpoint.keys()   # the MTP block skipped
    for name, tensor in checkpoint.items():
        if family.startswith("qwen") and name.endswith("norm.weight") \
                and not name.endswith("linear_attn.norm.weight"):
            tensor = tensor + 1   # kept as the file's scale (hybrid/layers.py's Norm.offset)
        if name.endswith("A_log"):   # the decay Folio computes, bit for bit
            assert torch.equal(-loaded[name].exp(), -tensor.exp()), name
            continue
        assert torch.equal(loaded[name], tensor), name


def test_greedy_output_matches_transformers_on_the_checkpoint(hybrid):
    _, model_dir, f32, _ = hybrid
    llm = greedy_matches_checkpoint(f32, model_dir, PROMPTS, MAX_TOKENS)
    assert_idle(llm.stats())



def test_a_q8_0_file_runs_kept_quantized_with_the_dequantized_logits(hybrid, monkeypatch):
    family, _, _, q8 = hybrid
    kept = kept_and_dequantized_agree(q8, PROMPTS[:2], monkeypatch)
    assert linear_kinds(kept) == KEPT[family]


@pytest.mark.parametrize("quant", ["Q8_0", "Q4_0"])
def test_a_reordered_out_proj_of_whole_blocks_stays_quantized(quant, tmp_path, tokenizer_dir,
                                                              monkeypatch):
    """Value heads of 32 (whole blocks): out_proj's reordered columns move block by block,
    kept quantized, with the dequantized file's logits."""
    model_dir = make_hybrid_dir(tmp_path, tokenizer_dir, "qwen3_5", linear_value_head_dim=32)
    path = write_hybrid_gguf(model_dir, tmp_path / f"model-{quant}.gguf", quant)
    kept = kept_and_dequantized_agree(path, PROMPTS[:2], monkeypatch)
    assert "out_proj" in linear_kinds(kept)



def test_malformed_files_are_refused_by_name(tmp_path, hybrid):
    family, model_dir, _, _ = hybrid
    arch = ARCH[family]
    qwen = family.startswith("qwen")
    recurrent = "ssm_a" if qwen else "shortconv.conv.weight"
    missing = write_hybrid_gguf(model_dir, tmp_path / "missing.gguf",
                                drop=(f"blk.2.{recurrent}",))
    kind = "linear" if qwen else "conv"
    assert f"blk.2 holds no whole mixer: its {kind} mixer lacks blk.2.{recurrent}" \
        in model_refusal(missing)
    if family.endswith("moe"):
        missing = write_hybrid_gguf(model_dir, tmp_path / "expert.gguf",
                                    drop=("blk.2.ffn_up_exps.weight",))
        assert ("blk.2 holds no whole feed-forward: its experts feed-forward lacks "
                "blk.2.ffn_up_exps.weight") in model_refusal(missing)
    if family == "lfm2_moe":
        dense = write_hybrid_gguf(model_dir, tmp_path / "dense.gguf", metadata={
            "{arch}.leading_dense_block_count": ("uint32", 2)})
        assert (f"blk.1 holds experts but metadata {arch}.leading_dense_block_count is 2"
                in model_refusal(dense))
        softmax = write_hybrid_gguf(model_dir, tmp_path / "softmax.gguf", metadata={
            "{arch}.expert_gating_func": ("uint32", 1)})
        assert f"metadata {arch}.expert_gating_func is 1" in model_refusal(softmax)
    # the metadata makes layer 0 attention; its tensors are a recurrent layer's
    if qwen:
        kinds = {RECURRENT_LAYERS: ("array", [False, False, True])}
    else:
        kinds = {"{arch}.attention.head_count_kv": ("array", [2, 2, 0])}
    swapped = write_hybrid_gguf(model_dir, tmp_path / "kinds.gguf", metadata=kinds)
    assert "blk.0 holds a recurrent layer but the metadata" in model_refusal(swapped)
    if qwen:
        odd = write_hybrid_gguf(model_dir, tmp_path / "odd.gguf",
                                metadata={"{arch}.ssm.inner_size": ("uint32", 30)})
        assert f"{arch}.ssm.inner_size (30) is not a multiple of" in model_refusal(odd)
    else:
        short = write_hybrid_gguf(model_dir, tmp_path / "short.gguf",
                                  metadata={"{arch}.attention.head_count_kv":
                                            ("array", [0, 2])})
        assert f"{arch}.attention.head_count_kv must list 3 integers" in model_refusal(short)


def test_lfm2_moe_routed_scaling_from_expert_weights_scale(tmp_path, tokenizer_dir):
    """A file that states expert_weights_scale (llama.cpp reads it; its converter writes
    none for LFM2-MoE) runs with it: transformers' tokens for a checkpoint scaled 2.5."""
    model_dir = make_moe_dir(tmp_path, tokenizer_dir, "lfm2_moe", tie_word_embeddings=True)
    path = write_hybrid_gguf(model_dir, tmp_path / "scaled.gguf",
                             metadata={"{arch}.expert_weights_scale": ("float32", 2.5)})
    prompts = PROMPTS[:2]
    expected = hf_greedy(model_dir, prompts, [MAX_TOKENS] * 2, "cpu")
    llm = LLM(str(path), dtype="float32", device="cpu", num_kv_blocks=64)
    params = [SamplingParams(temperature=0.0, max_tokens=MAX_TOKENS)] * 2
    assert [r.outputs[0].token_ids for r in llm.generate(prompts, params)] == expected


def test_a_positive_ssm_a_is_refused(tmp_path):
    from folio.executor.quantization.gguf.hybrid.weights import a_log_from_a

    a_log = np.array([-2.0, 0.0, 0.5, 3.0], dtype=np.float32)
    a = -torch.from_numpy(a_log).exp().numpy()
    assert np.array_equal(np.exp(a_log_from_a(a, "A_log")), np.exp(a_log))
    with pytest.raises(ValueError, match="must be negative"):
        a_log_from_a(np.array([-1.0, 0.5], dtype=np.float32), "A_log")
