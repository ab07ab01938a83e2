"""GGUF files of SmolLM3, OLMo 2/3 and Gemma 2/3 (executor/quantization/gguf/), written
here from tiny random transformers checkpoints the way llama.cpp's converter writes them
(gguf_family_writer.py): the F32 file gives transformers' greedy tokens on the source
checkpoint exactly; a Q8_0 file runs its linears kept quantized with the logits of the same
file dequantized; malformed files are refused by name before anything starts; Phi-3's
files are refused with the reason (Gemma 4's and gpt-oss's are served:
test_gguf_gemma4.py, test_gguf_gpt_oss.py)."""

from __future__ import annotations

import pytest

from folio import LLM, SamplingParams
from tests.conftest import _model_dir
from tests.executor.quantization.gguf_family_writer import write_family_gguf
from tests.executor.quantization.gguf_files import tiny_metadata, tiny_tensors, write_gguf
from tests.executor.quantization.gguf_checks import (greedy_matches_checkpoint,
                                                    kept_and_dequantized_agree, linear_kinds,
                                                    model_refusal)
from tests.hf_oracle import random_prompts

pytestmark = pytest.mark.usefixtures("cpu_ops_built")   # conftest.py
PROMPTS, _ = random_prompts(4, 1, 70, vocab=1024, seed=43)
MAX_TOKENS = 10
_SLIDING, _FULL = "sliding_attention", "full_attention"
# Each family's tiny checkpoint, as llama.cpp's converter can write it: SmolLM3 with four
# layers, the 4th without rotary (transformers' default, llama.cpp's only pattern).
CHECKPOINTS = {
    "smollm3": dict(arch="smollm3", num_layers=4, tie_word_embeddings=True),
    # OLMo 3: a sliding layer (window 48, shorter than most prompts) then a global one.
    "olmo3": dict(arch="olmo3", sliding_window=48, layer_types=[_SLIDING, _FULL]),
    # OLMo 2's file (no window): an OLMo 3 checkpoint whose layers are all global.
    "olmo2": dict(arch="olmo3", layer_types=[_FULL, _FULL]),
    # Gemma 2: sliding (window 48) and global layers alternating, soft-capping, the query
    # scale llama.cpp takes (head_dim). Tied, with a small init (test_models_parity.py).
    "gemma2": dict(arch="gemma2", sliding_window=48, attn_logit_softcapping=5.0,
                   final_logit_softcapping=3.0, query_pre_attn_scalar=16,
                   tie_word_embeddings=True, initializer_range=0.02),
    # Gemma 3: five sliding layers per global one (llama.cpp's period), the global rope
    # linearly scaled, the local base 10000.
    "gemma3": dict(arch="gemma3", num_layers=6, sliding_window=48, query_pre_attn_scalar=16,
                   layer_types=[_SLIDING] * 5 + [_FULL], tie_word_embeddings=True,
                   initializer_range=0.02,
                   rope_parameters={_FULL: {"rope_type": "linear", "factor": 2.0,
                                            "rope_theta": 1e6},
                                    _SLIDING: {"rope_type": "default", "rope_theta": 1e4}}),
}
# The linears a Q8_0 file keeps quantized (module names; q/k/v and gate/up fused): rows
# of 64 and 128 are whole blocks of 32.
_ALL = {"qkv_proj", "o_proj", "gate_up_proj", "down_proj", "lm_head"}
KEPT = {name: _ALL for name in CHECKPOINTS}


@pytest.fixture(scope="module", params=list(CHECKPOINTS))
def family(request, tmp_path_factory, tokenizer_dir):
    name = request.param
    model_dir = _model_dir(tmp_path_factory, tokenizer_dir, name, **CHECKPOINTS[name])
    out = tmp_path_factory.mktemp(f"{name}_gguf")
    return (name, model_dir, write_family_gguf(model_dir, out / "f32.gguf"),
            write_family_gguf(model_dir, out / "q8.gguf", "Q8_0"))


def test_greedy_output_matches_transformers_on_the_checkpoint(family):
    _, model_dir, f32, _ = family
    greedy_matches_checkpoint(f32, model_dir, PROMPTS, MAX_TOKENS)



def test_a_q8_0_file_runs_kept_quantized_with_the_dequantized_logits(family, monkeypatch):
    name, _, _, q8 = family
    kept = kept_and_dequantized_agree(q8, PROMPTS[:2], monkeypatch)
    assert linear_kinds(kept) == KEPT[name]



def test_malformed_files_are_refused_by_name(tmp_path, family):
    name, model_dir, _, _ = family
    missing = write_family_gguf(model_dir, tmp_path / "missing.gguf",
                                drop=("blk.1.attn_k.weight",))
    assert "blk.1 and blk.0 differ in attn_k.weight" in model_refusal(missing)
    odd = write_family_gguf(model_dir, tmp_path / "odd.gguf",
                            metadata={"{arch}.attention.head_count_kv": ("uint32", 3)})
    assert "attention.head_count (4) is not a multiple of" in model_refusal(odd)
    if name.startswith(("olmo", "gemma")):   # their norms after the sublayers
        norm = write_family_gguf(model_dir, tmp_path / "norm.gguf",
                                 drop=("blk.0.post_ffw_norm.weight",))
        assert "the GGUF file has no blk.0.post_ffw_norm.weight" in model_refusal(norm)
    if name.startswith("gemma"):
        capped = write_family_gguf(model_dir, tmp_path / "capped.gguf", metadata={
            "{arch}.final_logit_softcapping": ("float32", -3.0)})
        assert "final_logit_softcapping is -3.0: it must be a finite positive" \
            in model_refusal(capped)
    if name.startswith("olmo"):   # one bool a layer
        short = write_family_gguf(model_dir, tmp_path / "short.gguf", metadata={
            "{arch}.attention.sliding_window_pattern": ("array", [True])})
        assert "olmo2.attention.sliding_window_pattern must list 2 bools" in model_refusal(short)


@pytest.mark.parametrize("arch", ["phi3"])
def test_refused_files_say_why(arch, tmp_path):
    metadata = {key.replace("llama.", f"{arch}."): value
                for key, value in tiny_metadata().items()}
    path = write_gguf(tmp_path / "model.gguf", metadata, tiny_tensors(), arch)
    message = model_refusal(path)
    assert f"GGUF architecture {arch!r} is not served" in message
    assert "serve its Hugging Face checkpoint directory" in message


def test_a_stored_gemma_scale_normalises_as_one_plus_its_weight():
    """scale - 1 is not the weight in float32 (1 + weight dropped its low bits), but the norm
    holding the stored scale (offset 0) gives transformers' (1 + weight) bit for bit."""
    import torch

    from folio.executor.models.layers import GemmaRMSNorm, hold_stored_scales

    weight = torch.randn(64, generator=torch.Generator().manual_seed(0)) * 0.2
    scale = 1.0 + weight   # what the converter stores, in float32
    assert not torch.equal(scale - 1.0, weight)
    zero_centred, stored = GemmaRMSNorm(64, 1e-6), GemmaRMSNorm(64, 1e-6)
    zero_centred.weight.data.copy_(weight)
    hold_stored_scales(stored)
    stored.weight.data.copy_(scale)
    x = torch.randn(5, 64).to(torch.bfloat16)
    assert stored.weight.dtype == torch.float32 and stored.offset == 0.0
    assert torch.equal(stored(x), zero_centred(x))


@pytest.mark.parametrize("family", ["gemma2", "gemma3"], indirect=True)
def test_a_gemma_file_served_in_bfloat16_keeps_its_scales_in_float32(family):
    _, _, f32, _ = family
    import torch

    from folio.executor.models.layers import GemmaRMSNorm

    llm = LLM(str(f32), dtype="bfloat16", device="cpu", num_kv_blocks=64)
    norms = [m for m in llm.engine.executor.model.modules() if isinstance(m, GemmaRMSNorm)]
    assert norms and all(m.offset == 0.0 and m.weight.dtype == torch.float32 for m in norms)
    assert llm.generate(PROMPTS[:1], SamplingParams(temperature=0.0, max_tokens=2))
