"""GGUF files of gpt-oss (executor/quantization/gguf/gpt_oss/), written here from tiny random
transformers checkpoints the way llama.cpp's converter writes them (gguf_gpt_oss_writer.py:
experts split, transposed, MXFP4 blocks repacked): the F32 file reads back as the
checkpoint's config and gives transformers' greedy tokens on it exactly; a Q8_0 file keeps
its attention and lm_head quantized with the dequantized file's logits; a file whose
experts are MXFP4 (from a checkpoint with *_blocks / *_scales experts, as released) loads
the very weights the checkpoint's MXFP4 path loads and gives its tokens; malformed files
are refused by name before anything starts."""

from __future__ import annotations

import json

import pytest
import torch

from folio import LLM, SamplingParams
from tests.conftest import _model_dir
from tests.executor.quantization.gguf_checks import (greedy_matches_checkpoint,
                                                    kept_and_dequantized_agree, linear_kinds,
                                                    model_refusal)
from tests.executor.quantization.gguf_gpt_oss_writer import write_gpt_oss_gguf
from tests.hf_oracle import hf_greedy, random_prompts

pytestmark = pytest.mark.usefixtures("cpu_ops_built")   # conftest.py
PROMPTS, _ = random_prompts(4, 1, 70, vocab=1024, seed=47)
MAX_TOKENS = 10
_SLIDING, _FULL = "sliding_attention", "full_attention"
# Sliding (window 32, shorter than most prompts) then full layers (llama.cpp's period);
# sinks, biases, YaRN past an original length of 64 without truncation (gpt-oss's), four
# biased experts. The SwiGLU's alpha and limit are gpt-oss's (llama.cpp hard-codes them:
# the converter writes neither). A wider init: the default's answers repeat a few tokens.
CHECKPOINT = dict(arch="gpt_oss", sliding_window=32, layer_types=[_SLIDING, _FULL],
                  num_local_experts=4, num_experts_per_tok=2, intermediate_size=32,
                  initializer_range=0.2,
                  rope_parameters={"rope_type": "yarn", "factor": 16.0, "rope_theta": 1e4,
                                   "original_max_position_embeddings": 64, "beta_fast": 8.0,
                                   "beta_slow": 1.0, "truncate": False})


@pytest.fixture(scope="module")
def float_checkpoint(tmp_path_factory, tokenizer_dir):
    model_dir = _model_dir(tmp_path_factory, tokenizer_dir, "gpt_oss_gguf", **CHECKPOINT)
    return model_dir, write_gpt_oss_gguf(model_dir, model_dir.parent / "f32.gguf")


@pytest.fixture(scope="module")
def mxfp4_checkpoint(tmp_path_factory, float_checkpoint):
    """The float checkpoint's experts quantized: a directory holding them as MXFP4 blocks and
    scales (quant_method mxfp4, as released), and its GGUF file."""
    from safetensors.torch import load_file, save_file

    from tests.executor.test_attention_families import _quantize_mxfp4

    model_dir, _ = float_checkpoint
    packed_dir = tmp_path_factory.mktemp("gpt_oss_mxfp4_gguf")
    for file in model_dir.iterdir():
        if file.is_file() and file.suffix != ".gguf":
            (packed_dir / file.name).write_bytes(file.read_bytes())
    packed = {}
    for name, tensor in load_file(str(model_dir / "model.safetensors")).items():
        if name.endswith(("experts.gate_up_proj", "experts.down_proj")):   # [E, in, out]
            blocks, scales = _quantize_mxfp4(tensor.transpose(1, 2).contiguous())
            packed[name + "_blocks"], packed[name + "_scales"] = blocks, scales
        else:
            packed[name] = tensor
    save_file(packed, str(packed_dir / "model.safetensors"), metadata={"format": "pt"})
    config = json.loads((packed_dir / "config.json").read_text())
    config["quantization_config"] = {"quant_method": "mxfp4",
                                     "modules_to_not_convert": ["model.layers.*.self_attn"]}
    (packed_dir / "config.json").write_text(json.dumps(config))
    return packed_dir, write_gpt_oss_gguf(packed_dir, packed_dir.parent / "mxfp4.gguf")


def test_f32_file_reads_as_its_checkpoint_and_gives_transformers_tokens(float_checkpoint):
    from folio.executor.models.hf_config import parse_model_config
    from folio.executor.quantization.gguf.config import gguf_hf_config
    from folio.executor.quantization.gguf.file import open_gguf

    model_dir, path = float_checkpoint
    from_file = parse_model_config(gguf_hf_config(open_gguf(path))[0])
    checkpoint = parse_model_config(json.loads((model_dir / "config.json").read_text()))
    assert from_file.layer_windows == checkpoint.layer_windows == (32, None)
    assert from_file.rope == checkpoint.rope and checkpoint.rope.rope_type == "yarn"
    assert not from_file.rope.truncate
    assert from_file.moe == checkpoint.moe and from_file.attention_sinks
    greedy_matches_checkpoint(path, model_dir, PROMPTS, MAX_TOKENS)


def test_a_q8_0_file_keeps_attention_quantized_with_the_dequantized_logits(
        tmp_path, float_checkpoint, monkeypatch):
    """The converter's q8_0 file: q/k/v, o and lm_head kept as Q8_0 blocks; the experts
    (stacked parameters, not linears) and the F32 router dequantized."""
    model_dir, _ = float_checkpoint
    q8 = write_gpt_oss_gguf(model_dir, tmp_path / "q8.gguf", "Q8_0")
    kept = kept_and_dequantized_agree(q8, PROMPTS[:2], monkeypatch)
    assert linear_kinds(kept) == {"qkv_proj", "o_proj", "lm_head"}


def test_mxfp4_file_loads_the_checkpoints_mxfp4_weights_and_tokens(mxfp4_checkpoint):
    """The GGUF experts are ggml MXFP4 blocks; multiplied out at load they are the very
    weights the checkpoint's blocks give (executor/models/gpt_oss/mxfp4.py), every parameter
    equal, and the tokens the same."""
    from folio.executor.quantization.gguf.file import open_gguf

    packed_dir, path = mxfp4_checkpoint
    types = {t.name: t.tensor_type.name for t in open_gguf(path).tensors}
    assert {types[f"blk.{i}.ffn_{kind}_exps.weight"] for i in range(2)
            for kind in ("gate", "up", "down")} == {"MXFP4"}
    params = [SamplingParams(temperature=0.0, max_tokens=MAX_TOKENS)] * len(PROMPTS)
    engines = [LLM(str(source), dtype="float32", device="cpu", num_kv_blocks=64)
               for source in (packed_dir, path)]
    hf_path, gguf_file = (dict(e.engine.executor.model.named_parameters()) for e in engines)
    assert hf_path.keys() == gguf_file.keys()
    assert all(torch.equal(hf_path[name], gguf_file[name]) for name in hf_path)
    expected, got = ([r.outputs[0].token_ids for r in e.generate(PROMPTS, params)]
                     for e in engines)
    assert got == expected
    assert len({t for answer in expected for t in answer}) > 10   # not one repeated token


def test_served_in_bfloat16_like_the_checkpoint(mxfp4_checkpoint):
    """--dtype bfloat16: the experts multiplied out into it, as the checkpoint's are."""
    packed_dir, path = mxfp4_checkpoint
    params = [SamplingParams(temperature=0.0, max_tokens=4)] * 2
    answers = [[r.outputs[0].token_ids for r in
                LLM(str(source), dtype="bfloat16", device="cpu",
                    num_kv_blocks=64).generate(PROMPTS[:2], params)]
               for source in (packed_dir, path)]
    assert answers[0] == answers[1]


def test_malformed_files_are_refused_by_name(tmp_path, float_checkpoint):
    model_dir, _ = float_checkpoint
    cases = [
        (dict(drop=("blk.1.attn_sinks.weight",)),
         "the GGUF file has no blk.1.attn_sinks.weight"),
        (dict(drop=("blk.0.ffn_up_exps.bias",)), "the GGUF file has no blk.0.ffn_up_exps.bias"),
        (dict(retype={"blk.0.attn_q.weight": "MXFP4"}),
         "tensor blk.0.attn_q.weight is MXFP4: Folio reads MXFP4 only in gpt-oss's expert"),
        (dict(metadata={"{arch}.expert_used_count": ("uint32", 5)}),
         "gpt-oss.expert_used_count (5) is more than gpt-oss.expert_count (4)"),
        (dict(metadata={"{arch}.attention.sliding_window_pattern": ("array", [True])}),
         "gpt-oss.attention.sliding_window_pattern must list 2 bools"),
        (dict(metadata={"{arch}.rope.scaling.type": ("string", "linear")}),
         "GGUF rope scaling 'linear' is not supported for gpt-oss"),
        (dict(metadata={"{arch}.expert_weights_scale": ("float32", 2.0)}),
         "gpt-oss.expert_weights_scale is 2.0"),
    ]
    for index, (change, message) in enumerate(cases):
        path = write_gpt_oss_gguf(model_dir, tmp_path / f"bad{index}.gguf", **change)
        assert message in model_refusal(path)


def test_a_sliding_window_pattern_in_the_file_sets_the_layers(tmp_path, float_checkpoint):
    """Newer converters may write one bool a layer: it is what slides (here, neither)."""
    from folio.executor.models.hf_config import parse_model_config
    from folio.executor.quantization.gguf.config import gguf_hf_config
    from folio.executor.quantization.gguf.file import open_gguf

    model_dir, _ = float_checkpoint
    path = write_gpt_oss_gguf(model_dir, tmp_path / "pattern.gguf", metadata={
        "{arch}.attention.sliding_window_pattern": ("array", [False, False])})
    assert parse_model_config(gguf_hf_config(open_gguf(path))[0]).layer_windows == ()
