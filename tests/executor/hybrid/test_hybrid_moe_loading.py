"""How the hybrid MoE families' configs and checkpoints are read, on files transformers
writes: each family's routing options; a Qwen3.5-MoE released as the vision-language
wrapper (text_config, model.language_model.*, a vision tower) and one with its experts
stacked load the same weights as the plain text checkpoint; what cannot be served is
refused by name before start."""

from __future__ import annotations

import json

import pytest
import torch

from folio.executor.models.hf_config import read_model_config
from folio.executor.models.hybrid.loader import load_hybrid_model
from folio.executor.ops import TORCH_OPS
from tests.executor.hybrid.moe_checkpoints import FAMILIES, copy_tokenizer, make_moe_model


@pytest.fixture(scope="module")
def saved(tmp_path_factory, tokenizer_dir):
    """family -> (its transformers model, the directory save_pretrained wrote)."""
    out = {}
    for family in FAMILIES:
        path = tmp_path_factory.mktemp(family)
        copy_tokenizer(path, tokenizer_dir)
        model = make_moe_model(family)
        model.save_pretrained(str(path), safe_serialization=True)
        out[family] = model, path
    return out


def _load(path):
    config = read_model_config(path)
    model = load_hybrid_model(path, config, TORCH_OPS, torch.float32, torch.device("cpu"),
                              max_positions=64)
    return config, {name: p.detach() for name, p in model.named_parameters()}


def test_each_family_reads_its_routing(saved):
    moe = {family: read_model_config(path).moe for family, (_, path) in saved.items()}
    assert moe["qwen3_5_moe"].sparse_layers == (True, True, True)
    assert moe["qwen3_5_moe"].renormalize and moe["qwen3_5_moe"].shared_expert_size == 48
    assert moe["qwen3_next"].sparse_layers == (False, True, True)   # mlp_only_layers [0]
    assert not moe["qwen3_next"].renormalize and moe["qwen3_next"].shared_expert_size == 48
    lfm = moe["lfm2_moe"]
    assert lfm.sparse_layers == (False, True, True) and lfm.shared_expert_size == 0
    assert (lfm.scoring, lfm.expert_bias, lfm.routed_scaling, lfm.renorm_eps) == \
        ("sigmoid", True, 2.5, 1e-6)
    # LFM2-MoE's dense layer keeps intermediate_size as written (LFM2 would adjust it).
    assert read_model_config(saved["lfm2_moe"][1]).intermediate_size == 96


def test_every_family_loads_the_transformers_weights(saved):
    """The per-expert tensors transformers saves land in the stacked experts, Qwen3-Next's
    fused projections in Qwen3.5's four; the expert bias stays float32."""
    for family, (hf_model, path) in saved.items():
        _, params = _load(path)
        hf_state = hf_model.state_dict()   # transformers' in-memory layout: stacked experts
        for layer in (1, 2):
            block = "mlp" if family != "lfm2_moe" else "feed_forward"
            hf_block = f"model.layers.{layer}.{block}"
            assert torch.equal(params[f"layers.{layer}.{block}.w13"],
                               hf_state[f"{hf_block}.experts.gate_up_proj"])
            assert torch.equal(params[f"layers.{layer}.{block}.w2"],
                               hf_state[f"{hf_block}.experts.down_proj"])
        if family == "lfm2_moe":
            bias = params["layers.1.feed_forward.expert_bias"]
            assert bias.dtype == torch.float32 and bias.abs().sum() > 0
        if family == "qwen3_next":   # q of key head 1 starts at row 64 of in_proj_qkvz
            qkvz = hf_state["model.layers.0.linear_attn.in_proj_qkvz.weight"]
            qkv = params["layers.0.linear_attn.in_proj_qkv.weight"]
            assert torch.equal(qkv[16:32], qkvz[64:80]) and not torch.equal(qkv, qkvz[:96])


def test_the_released_wrapper_and_stacked_experts_load_the_same_weights(saved, tmp_path,
                                                                        tokenizer_dir):
    import transformers as hf
    from safetensors.torch import save_file

    flat_model, flat_dir = saved["qwen3_5_moe"]
    _, expected = _load(flat_dir)
    # As Qwen3.5-MoE is released: Qwen3_5MoeForConditionalGeneration with a vision tower
    # (tiny here), the text model's weights copied in.
    text = flat_model.config.to_dict()
    vision = dict(depth=1, hidden_size=32, num_heads=2, intermediate_size=64,
                  out_hidden_size=64, patch_size=2, temporal_patch_size=1,
                  spatial_merge_size=1, num_position_embeddings=16)
    wrapper = hf.Qwen3_5MoeForConditionalGeneration(hf.Qwen3_5MoeConfig(
        text_config=text, vision_config=vision, tie_word_embeddings=False))
    wrapper.model.language_model.load_state_dict(flat_model.model.state_dict())
    wrapper.lm_head.load_state_dict(flat_model.lm_head.state_dict())
    wrapped = tmp_path / "wrapped"
    wrapper.save_pretrained(str(wrapped), safe_serialization=True)
    copy_tokenizer(wrapped, tokenizer_dir)
    raw = json.loads((wrapped / "config.json").read_text())
    assert raw["architectures"] == ["Qwen3_5MoeForConditionalGeneration"] and "text_config" in raw
    config, params = _load(wrapped)
    assert config.architecture == "Qwen3_5MoeForCausalLM" and config.num_layers == 3
    assert params.keys() == expected.keys()
    assert all(torch.equal(params[name], expected[name]) for name in expected)
    # Experts stacked in the file (transformers' in-memory names, experts.gate_up_proj).
    stacked = tmp_path / "stacked"
    stacked.mkdir()
    (stacked / "config.json").write_text((flat_dir / "config.json").read_text())
    save_file({name: t.contiguous() for name, t in flat_model.state_dict().items()},
              str(stacked / "model.safetensors"))
    _, params = _load(stacked)
    assert all(torch.equal(params[name], expected[name]) for name in expected)


def test_the_dense_qwen3_5_wrapper_is_read_as_its_text_model(tmp_path):
    import transformers as hf

    from tests.executor.hybrid.checkpoints import QWEN3_5

    text = dict(QWEN3_5, vocab_size=1024, num_hidden_layers=3, eos_token_id=0)
    hf.Qwen3_5Config(text_config=text, vision_config={"depth": 1},
                     architectures=["Qwen3_5ForConditionalGeneration"]).save_pretrained(tmp_path)
    config = read_model_config(tmp_path)
    assert config.architecture == "Qwen3_5ForCausalLM" and config.moe is None
    assert (config.num_layers, config.intermediate_size, config.rotary_dim) == (3, 128, 8)
    assert config.hybrid.layer_kinds == ("linear", "attention", "linear")
    (tmp_path / "config.json").write_text(json.dumps(
        {"architectures": ["Qwen3_5MoeForConditionalGeneration"]}))
    with pytest.raises(ValueError, match="Qwen3_5MoeForConditionalGeneration: config.json "
                                         "has no text_config"):
        read_model_config(tmp_path)


def test_what_the_moe_hybrids_cannot_run_with_is_refused_by_name(saved):
    from folio.preflight import check_engine
    from folio.shared.config import EngineConfig, SettingError

    path = saved["lfm2_moe"][1]
    for setting, value in (("enable_lora", True), ("tensor_parallel_size", 2)):
        with pytest.raises(SettingError) as info:
            check_engine(EngineConfig(model=str(path), device="cpu", **{setting: value}))
        assert setting in str(info.value)
        assert "Lfm2MoeForCausalLM (a hybrid model with recurrent state)" in str(info.value)
    raw = json.loads((saved["qwen3_next"][1] / "config.json").read_text())
    raw["attention_bias"] = True
    with pytest.raises(ValueError, match="attention_bias true is not supported for "
                                         "Qwen3NextForCausalLM"):
        from folio.executor.models.hf_config import parse_model_config
        parse_model_config(raw)
