"""Gemma 4's config as Folio reads it, against transformers' own reading of the same
config.json: which layers share which cache, each layer's head size and KV heads; the KV
cache allocates only the layers that keep one, and a block's bytes are the sum over their
shapes; what Folio cannot serve is refused by name."""

from __future__ import annotations

import json

import pytest
import torch

from folio.executor.kv_cache import allocate_kv_cache, bytes_per_block
from folio.executor.models.hf_config import parse_model_config, read_model_config
from tests.executor.gemma4.checkpoints import _BASE, VARIANTS


def _configs(variant: str, tmp_path):
    import transformers as hf

    config = hf.Gemma4TextConfig(**_BASE, **VARIANTS[variant])
    config.architectures = ["Gemma4ForCausalLM"]
    config.save_pretrained(str(tmp_path))
    return config, read_model_config(tmp_path)


@pytest.mark.parametrize("variant", VARIANTS)
def test_layers_read_as_transformers_reads_them(variant, tmp_path):
    hf_config, config = _configs(variant, tmp_path)
    spec = config.gemma4
    for i, mode in enumerate(hf_config.kv_sharing_modes):
        assert (spec.kv_source[i] != i) == (mode == "reuse"), i
        if mode == "reuse":   # the last earlier layer of its type keeps the cache it reads
            assert hf_config.kv_sharing_modes[spec.kv_source[i]] == "store"
            assert hf_config.layer_types[spec.kv_source[i]] == hf_config.layer_types[i]
        layer = hf_config.per_layer_config[i]
        assert spec.layer_heads[i] == (layer.num_key_value_heads, layer.head_dim), i
    assert config.attention_scale == 1.0
    assert config.layer_windows == tuple(16 if t == "sliding_attention" else None
                                         for t in hf_config.layer_types)


@pytest.mark.parametrize("storage", [torch.float32, torch.bfloat16, torch.int8])
@pytest.mark.parametrize("variant", VARIANTS)
def test_a_block_costs_the_sum_of_the_caches_it_allocates(variant, storage, tmp_path):
    hf_config, config = _configs(variant, tmp_path)
    caches = allocate_kv_cache(config, 3, 16, storage, torch.device("cpu"))
    # A cache for each layer that does not reuse another's, of that layer's shape (int8
    # rows end with their 2-element scale).
    owners = [i for i, mode in enumerate(hf_config.kv_sharing_modes) if mode != "reuse"]
    scale = 2 if storage == torch.int8 else 0
    assert [(k.shape[2], k.shape[3] - scale) for k, _ in caches] == [
        (hf_config.per_layer_config[i].num_key_value_heads,
         hf_config.per_layer_config[i].head_dim) for i in owners]
    allocated = sum(k.nbytes + v.nbytes for k, v in caches) // 3
    assert bytes_per_block(config, 16, storage) == allocated
    with pytest.raises(ValueError, match="head sizes differ"):
        config.kv_block_bytes(16, 64)   # one row size cannot describe these layers


def test_kv_sharing_makes_a_block_cheaper():
    def block(**extra):
        raw = {**_BASE, "architectures": ["Gemma4ForCausalLM"], "num_kv_shared_layers": 0,
               **extra}
        return bytes_per_block(parse_model_config(raw), 16, torch.bfloat16)

    # Layers 0-5: sliding 2x16, global 2x32 per token and K/V; sharing the last two
    # (a sliding and a global one) saves 2 * 16 * 2 * (2*16 + 2*32) bytes a block.
    assert block() - block(num_kv_shared_layers=2) == 2 * 16 * 2 * (2 * 16 + 2 * 32)


@pytest.mark.parametrize("extra, named", [
    (dict(enable_moe_block=True, num_experts=4, top_k_experts=5, moe_intermediate_size=32),
     "top_k_experts"),
    (dict(enable_moe_block=True, num_experts=4, top_k_experts=2), "moe_intermediate_size"),
    (dict(use_bidirectional_attention="all"), "use_bidirectional_attention"),
    (dict(num_kv_shared_layers=6), "num_kv_shared_layers"),
])
def test_what_folio_cannot_serve_is_refused_by_name(extra, named):
    with pytest.raises(ValueError, match=named):
        parse_model_config({**_BASE, "architectures": ["Gemma4ForCausalLM"], **extra})


@pytest.mark.parametrize("setting, value", [("enable_lora", True),
                                            ("tensor_parallel_size", 2)])
def test_features_it_cannot_run_with_are_refused_before_start(setting, value, tmp_path):
    from folio.preflight import check_engine
    from folio.shared.config import EngineConfig, SettingError

    _configs("shared_kv_ple", tmp_path)
    torch.manual_seed(0)
    from safetensors.torch import save_file   # a weight file, so the directory checks pass

    save_file({"model.norm.weight": torch.ones(64)}, str(tmp_path / "model.safetensors"))
    with pytest.raises(SettingError) as info:
        check_engine(EngineConfig(model=str(tmp_path), device="cpu", skip_tokenizer_init=True,
                                  **{setting: value}))
    assert setting in str(info.value) and "Gemma 4" in str(info.value)


def test_config_json_without_class_defaults_reads_transformers_defaults(tmp_path):
    """transformers leaves out of config.json what equals its class defaults only when
    told to; a hand-written one may too: Folio fills in the same values."""
    raw = {"architectures": ["Gemma4ForCausalLM"], "vocab_size": 1024, "hidden_size": 64,
           "num_hidden_layers": 6, "num_attention_heads": 4, "num_key_value_heads": 2,
           "intermediate_size": 96}
    (tmp_path / "config.json").write_text(json.dumps(raw))
    config = read_model_config(tmp_path)
    spec = config.gemma4
    assert config.layer_windows == (512,) * 5 + (None,)
    assert spec.layer_heads == ((2, 256),) * 5 + ((2, 512),)
    assert spec.per_layer_input_size == 256 and spec.per_layer_vocab == 262144
    assert config.rope.rope_type == "proportional" and config.rope.proportion == 0.25
    assert config.local_rope.theta == 10000.0 and config.rope.theta == 1e6


def test_int4_is_refused_where_a_gemma4_layer_takes_a_partial_group(tmp_path):
    from folio.executor.quantization.groups import quantization_problem

    _, config = _configs("shared_kv_ple", tmp_path)   # per-layer inputs 8 wide
    assert "per_layer_projection" in quantization_problem("int4", config)
    assert quantization_problem("int8", config) is None


def test_the_planner_counts_the_blocks_the_executor_would_hold(tmp_path):
    from folio.planner.simulator.command import blocks_in_memory

    _, config = _configs("k_eq_v", tmp_path)
    assert blocks_in_memory(config, 1.0, 16, "bfloat16") \
        == 2**30 // bytes_per_block(config, 16, torch.bfloat16)


def test_checkpoints_keeping_kv_weights_of_shared_layers_load_without_them(tmp_path,
                                                                            tokenizer_dir):
    """Released checkpoints may still hold k/v projections and norms for the layers that
    reuse another's keys and values (transformers ignores them): Folio skips them too and
    gives the same tokens; a tensor with no place at all is refused naming it."""
    from safetensors.torch import load_file, save_file

    from folio import LLM, SamplingParams
    from tests.executor.gemma4.checkpoints import make_gemma4_dir

    model_dir = make_gemma4_dir(tmp_path, tokenizer_dir, "shared_kv_ple")
    params = SamplingParams(temperature=0.0, max_tokens=6)
    prompts = [[5, 9, 200, 31, 7] * 5, [3]]

    def tokens():
        llm = LLM(str(model_dir), dtype="float32", device="cpu", num_kv_blocks=32)
        return [r.outputs[0].token_ids for r in llm.generate(prompts, params)]

    before = tokens()
    path = model_dir / "model.safetensors"
    tensors = load_file(str(path))
    for name in ("k_proj", "v_proj"):
        tensors[f"model.layers.4.self_attn.{name}.weight"] = torch.randn(32, 64)
    tensors["model.layers.5.self_attn.k_norm.weight"] = torch.randn(32)
    save_file(tensors, str(path), metadata={"format": "pt"})
    assert tokens() == before
    tensors["model.layers.1.self_attn.frobnicate.weight"] = torch.randn(4)
    save_file(tensors, str(path), metadata={"format": "pt"})
    with pytest.raises(ValueError, match="frobnicate.*has no place"):
        tokens()


def test_the_last_layer_is_global_as_transformers_forces_it():
    import transformers as hf

    types = ["sliding_attention"] * 6
    hf_config = hf.Gemma4TextConfig(**{**_BASE, "layer_types": list(types)})
    config = parse_model_config({**_BASE, "architectures": ["Gemma4ForCausalLM"],
                                 "layer_types": types})
    assert hf_config.layer_types[-1] == "full_attention"
    assert config.layer_windows == tuple(16 if t == "sliding_attention" else None
                                         for t in hf_config.layer_types)
    assert config.gemma4.layer_heads[-1] == (2, 32)
