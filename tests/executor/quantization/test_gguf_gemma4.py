"""GGUF files of Gemma 4's text model (executor/quantization/gguf/gemma4/), written here from
tiny random transformers checkpoints the way llama.cpp's converter writes them
(gemma4_gguf_writer.py): the F32 file of each variant (KV sharing as llama.cpp reads it, with
double-wide MLPs and per-layer inputs; values = keys with one global KV head, a final softcap and the MoE block)
gives transformers' greedy tokens on the source checkpoint exactly; a Q8_0 file runs its
linears kept quantized, in the native decode step, with the logits of the same file
dequantized; malformed files are refused by name before anything starts."""

from __future__ import annotations

import numpy as np
import pytest

from tests.executor.gemma4.checkpoints import make_gemma4_dir
from tests.executor.quantization.gemma4_gguf_writer import write_gemma4_gguf
from tests.executor.quantization.gguf_checks import (greedy_matches_checkpoint,
                                                    kept_and_dequantized_agree, linear_kinds,
                                                    model_refusal)
from tests.hf_oracle import random_prompts

pytestmark = pytest.mark.usefixtures("cpu_ops_built")   # conftest.py
# Lengths 1..60 (the sliding layers' window is 16), 10 new tokens each.
PROMPTS, _ = random_prompts(4, 1, 60, vocab=1024, seed=47)
MAX_TOKENS = 10
VARIANTS = ("plain", "shared_kv_last_three", "k_eq_v")


@pytest.fixture(scope="module", params=VARIANTS)
def gemma4(request, tmp_path_factory, tokenizer_dir):
    name = request.param
    model_dir = make_gemma4_dir(tmp_path_factory.mktemp(name), tokenizer_dir, name)
    return name, model_dir, write_gemma4_gguf(
        model_dir, tmp_path_factory.mktemp(f"{name}_gguf") / "f32.gguf")


@pytest.fixture(scope="module")
def shared_kv(tmp_path_factory, tokenizer_dir):
    return make_gemma4_dir(tmp_path_factory.mktemp("shared_kv"), tokenizer_dir,
                           "shared_kv_last_three")


def test_greedy_output_matches_transformers_on_the_checkpoint(gemma4):
    _, model_dir, f32 = gemma4
    greedy_matches_checkpoint(f32, model_dir, PROMPTS, MAX_TOKENS)


def test_a_q8_0_file_runs_kept_quantized_in_the_native_step(shared_kv, tmp_path,
                                                            monkeypatch, caplog):
    q8 = write_gemma4_gguf(shared_kv, tmp_path / "q8.gguf", "Q8_0")
    with caplog.at_level("INFO", logger="folio.executor"):
        kept = kept_and_dequantized_agree(q8, PROMPTS[:2], monkeypatch)
    # q/k/v fused where a layer keeps a cache, q alone where it reads another's; the
    # per-layer inputs' linears whose rows are whole blocks (the gate's input is 64 wide,
    # the projection's 8: F16); the tied LM head takes the embedding's blocks.
    assert linear_kinds(kept) == {"qkv_proj", "q_proj", "o_proj", "gate_up_proj",
                                  "down_proj", "per_layer_input_gate",
                                  "per_layer_model_projection", "lm_head"}
    assert "decode step: native, one C++ call for the layers" in caplog.text


def _refusal(model_dir, path, **changes) -> str:
    return model_refusal(write_gemma4_gguf(model_dir, path, **changes))


def test_malformed_files_are_refused_by_name(shared_kv, tmp_path):
    assert "the GGUF file has no blk.1.attn_k.weight" in _refusal(
        shared_kv, tmp_path / "a.gguf", drop=("blk.1.attn_k.weight",))
    assert "tensor blk.2.attn_q.weight has shape [64, 64]; the metadata gives [64, 128]" \
        in _refusal(shared_kv, tmp_path / "b.gguf", tensors={
            "blk.2.attn_q.weight": np.zeros((64, 64), dtype=np.float32)})
    assert "rope_freqs.weight is not a proportional rope" in _refusal(
        shared_kv, tmp_path / "c.gguf", tensors={
            "rope_freqs.weight": np.full(16, 0.5, dtype=np.float32)})
    assert "gemma4.attention.sliding_window_pattern: the last layer slides" in _refusal(
        shared_kv, tmp_path / "d.gguf", metadata={
            "{arch}.attention.sliding_window_pattern": ("array", [True] * 6)})
    # Two shared layers: layer 4 (sliding) reads the last kept sliding layer's cache in
    # transformers (3), the one before the last kept layer in llama.cpp (2, global).
    assert "layer 4 reads layer 3's cache in transformers but layer 2's in llama.cpp" \
        in _refusal(shared_kv, tmp_path / "e.gguf", metadata={
            "{arch}.attention.shared_kv_layers": ("uint32", 2)})
    assert "gemma4.feed_forward_length must list 6 integers" in _refusal(
        shared_kv, tmp_path / "f.gguf", metadata={
            "{arch}.feed_forward_length": ("array", [96, 96])})
    assert "the GGUF file has no per_layer_token_embd.weight" in _refusal(
        shared_kv, tmp_path / "h.gguf", drop=("per_layer_token_embd.weight",))
    assert "GGUF tensor 'blk.0.attn_qkv.weight': fused q/k/v" in _refusal(
        shared_kv, tmp_path / "g.gguf", tensors={
            "blk.0.attn_qkv.weight": np.zeros((64, 64), dtype=np.float32)})


def test_values_equal_keys_only_on_every_global_layer(tmp_path, tokenizer_dir):
    model_dir = make_gemma4_dir(tmp_path, tokenizer_dir, "k_eq_v_dense")
    # k_eq_v: the global layers (2 and 5) hold no attn_v; one given back to layer 2 alone
    message = _refusal(model_dir, tmp_path / "v.gguf", tensors={
        "blk.2.attn_v.weight": np.zeros((32, 64), dtype=np.float32)})
    assert "blk.2.attn_v.weight: Gemma 4's values are the keys' projection on every " \
           "global layer" in message
