"""The pieces under the architectures: config reading, rope tables against transformers'
own functions, checkpoint names and completeness, and windowed attention in a forward pass
against transformers (a window shorter than the prompt)."""

from __future__ import annotations

import json
import math

import pytest
import torch
from safetensors.torch import load_file, save_file

from folio.executor.model_config import ModelConfig
from folio.executor.model_loader import load_model
from folio.executor.models.architectures import SUPPORTED_ARCHITECTURES
from folio.executor.models.describe import describe
from folio.executor.models.hf_config import parse_model_config, read_model_config
from folio.executor.ops import TORCH_OPS, AttentionInputs
from folio.executor.rotary import longrope_positions, rotary_cos_sin_cache
from folio.tiny_models import CLASS_PREFIXES, make_random_checkpoint

_BASE = {"vocab_size": 64, "hidden_size": 32, "num_hidden_layers": 4,
         "num_attention_heads": 4, "num_key_value_heads": 2, "intermediate_size": 16}


def _config(arch: str, **extra) -> ModelConfig:
    return parse_model_config({"architectures": [arch], **_BASE, **extra})


@pytest.mark.parametrize("arch", SUPPORTED_ARCHITECTURES)
def test_every_supported_architecture_reads_a_config(arch):
    experts = {"num_local_experts": 4, "num_experts": 4, "num_experts_per_tok": 2,
               "moe_intermediate_size": 8}
    config = _config(arch, **experts)
    assert config.architecture == arch and config.num_layers == 4
    assert (config.moe is not None) == ("Moe" in arch or "Mixtral" in arch or "GptOss" in arch
                                        or "Next" in arch)


def test_the_tiny_models_cover_every_supported_architecture():
    assert sorted(f"{prefix}ForCausalLM" for prefix in CLASS_PREFIXES.values()) \
        == sorted(SUPPORTED_ARCHITECTURES)


def test_unsupported_architecture_is_one_line_naming_the_supported(tmp_path):
    from folio.preflight import check_model_dir
    from folio.shared.config import SettingError

    (tmp_path / "config.json").write_text(json.dumps({"architectures": ["GPT2LMHeadModel"]}))
    with pytest.raises(SettingError) as info:
        check_model_dir(str(tmp_path))
    message = str(info.value)
    assert "\n" not in message and "'GPT2LMHeadModel'" in message
    assert all(arch in message for arch in SUPPORTED_ARCHITECTURES)


def test_gemma3_old_config_layers_ropes_and_description():
    config = _config("Gemma3ForCausalLM", num_hidden_layers=6, head_dim=8, sliding_window=512,
                     sliding_window_pattern=3, rope_theta=1e6, rope_local_base_freq=1e4,
                     query_pre_attn_scalar=64)
    assert config.layer_windows == (512, 512, None, 512, 512, None)
    assert config.layer_rope(0).theta == 1e4 and config.layer_rope(2).theta == 1e6
    assert config.attention_scale == 64 ** -0.5 and config.hidden_act == "gelu_tanh"
    assert config.tie_word_embeddings and config.gemma and config.qk_norm
    assert describe(config) == ("Gemma3ForCausalLM: 6 layers, GQA 4/2, head_dim 8, q/k norm, "
                                 "sliding window 512 on 4 of 6 layers, rope 1e6/1e4")


def test_qwen3_moe_sparse_layers_and_bad_top_k():
    moe = _config("Qwen3MoeForCausalLM", num_experts=6, num_experts_per_tok=2,
                  moe_intermediate_size=8, decoder_sparse_step=2, mlp_only_layers=[3]).moe
    assert moe.sparse_layers == (False, True, False, False)
    assert (moe.num_experts, moe.top_k, moe.renormalize, moe.round_weights) == (6, 2, False, True)
    with pytest.raises(ValueError, match="num_experts_per_tok"):
        _config("MixtralForCausalLM", num_local_experts=2, num_experts_per_tok=3)
    with pytest.raises(ValueError, match="partial_rotary_factor"):
        _config("LlamaForCausalLM", partial_rotary_factor=0.5)


def test_longrope_tables_match_transformers():
    from transformers import Phi3Config
    from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

    rope = {"rope_type": "longrope", "rope_theta": 10000.0, "partial_rotary_factor": 0.5,
            "short_factor": [1.0, 1.3, 2.0, 1.5], "long_factor": [1.0, 4.0, 8.0, 6.0]}
    hf = Phi3Config(hidden_size=64, num_attention_heads=4, max_position_embeddings=1024,
                    original_max_position_embeddings=64, rope_parameters=dict(rope))
    raw = json.loads(hf.to_json_string())
    raw["architectures"] = ["Phi3ForCausalLM"]
    config = parse_model_config(raw)
    assert config.rotary_dim == 8
    table = rotary_cos_sin_cache(config.rope, 8, 100, torch.device("cpu"))
    positions = torch.arange(100, dtype=torch.float)
    for half, seq_len in ((0, None), (1, 65)):
        inv_freq, scale = ROPE_INIT_FUNCTIONS["longrope"](hf, None, seq_len=seq_len)
        assert scale == pytest.approx(math.sqrt(1 + math.log(16) / math.log(64)))
        freqs = positions[:, None] * inv_freq[None, :]
        expected = torch.cat((freqs.cos() * scale, freqs.sin() * scale), dim=-1)
        torch.testing.assert_close(table[half * 100:(half + 1) * 100], expected)
    # Rows: a sequence past the original length reads the long half, every token of it.
    rows = longrope_positions(torch.tensor([0, 1, 2, 70, 64]), torch.tensor([3, 71, 65]),
                              torch.tensor([0, 3, 4, 5]), 64, 100)
    assert rows.tolist() == [0, 1, 2, 170, 164]


def _stack_experts(model_dir) -> None:
    """Rewrite a Mixtral checkpoint with transformers' stacked expert tensors."""
    tensors = load_file(str(model_dir / "model.safetensors"))
    layers = {int(name.split(".")[2]) for name in tensors if ".experts." in name}
    for layer in layers:
        prefix = f"model.layers.{layer}.block_sparse_moe.experts"
        count = len({n for n in tensors if n.startswith(prefix) and n.endswith(".w1.weight")})
        pop = [[tensors.pop(f"{prefix}.{e}.{w}.weight") for e in range(count)]
               for w in ("w1", "w3", "w2")]
        tensors[f"{prefix}.gate_up_proj"] = torch.stack(
            [torch.cat((gate, up)) for gate, up in zip(pop[0], pop[1])])
        tensors[f"{prefix}.down_proj"] = torch.stack(pop[2])
    save_file(tensors, str(model_dir / "model.safetensors"))


def test_expert_checkpoints_per_expert_stacked_and_incomplete(tmp_path):
    per_expert, stacked = tmp_path / "per_expert", tmp_path / "stacked"
    for path in (per_expert, stacked):
        make_random_checkpoint(path, arch="mixtral", vocab_size=64, hidden_size=32,
                               intermediate_size=16, num_local_experts=3,
                               num_experts_per_tok=2, dtype="bfloat16")
    _stack_experts(stacked)
    config = read_model_config(per_expert)
    models = [load_model(path, config, TORCH_OPS, torch.float32, torch.device("cpu"), 64)
              for path in (per_expert, stacked)]
    original = load_file(str(per_expert / "model.safetensors"))
    w13 = models[0].layers[1].mlp.w13
    expert = "model.layers.1.block_sparse_moe.experts.2"
    assert torch.equal(w13[2, :16], original[f"{expert}.w1.weight"].float())   # gate rows
    assert torch.equal(w13[2, 16:], original[f"{expert}.w3.weight"].float())   # up rows
    for a, b in zip(models[0].parameters(), models[1].parameters()):
        assert torch.equal(a, b)
    del original["model.layers.0.block_sparse_moe.experts.1.w3.weight"]
    save_file(original, str(per_expert / "model.safetensors"))
    with pytest.raises(ValueError, match=r"missing 1 .*layers\.0\.mlp\.w13"):
        load_model(per_expert, config, TORCH_OPS, torch.float32, torch.device("cpu"), 64)


@pytest.mark.parametrize("arch,extra", [
    ("gemma3", dict(num_layers=3, sliding_window=12, query_pre_attn_scalar=16,
                    layer_types=["sliding_attention", "full_attention", "sliding_attention"])),
    ("gemma2", dict(sliding_window=12, attn_logit_softcapping=5.0,
                    final_logit_softcapping=3.0)),
    ("mistral", dict(sliding_window=12)),
])
def test_window_shorter_than_the_prompt_matches_transformers(arch, extra, tmp_path):
    from transformers import AutoModelForCausalLM

    make_random_checkpoint(tmp_path, arch=arch, vocab_size=64, hidden_size=32,
                           intermediate_size=32, **extra)
    config = read_model_config(tmp_path)
    tokens, block = 40, 16   # the 40-token prompt is far past the 12-token window
    model = load_model(tmp_path, config, TORCH_OPS, torch.float32, torch.device("cpu"), 64)
    ids = torch.randint(0, 64, (tokens,), generator=torch.Generator().manual_seed(0))
    caches = [(torch.zeros(4, block, config.num_kv_heads, config.head_dim),
               torch.zeros(4, block, config.num_kv_heads, config.head_dim))
              for _ in range(config.num_layers)]
    inputs = TORCH_OPS.prepare(AttentionInputs(
        slot_mapping=torch.arange(tokens), block_tables=torch.arange(4, dtype=torch.int32)[None],
        seq_lens=torch.tensor([tokens]), query_start_loc=torch.tensor([0, tokens])), block)
    with torch.inference_mode():
        ours = model.compute_logits(model(ids, torch.arange(tokens), caches, inputs))
        hf = AutoModelForCausalLM.from_pretrained(str(tmp_path), dtype=torch.float32)
        expected = hf(ids[None]).logits[0].float()
    assert any(w and w < tokens for w in config.layer_windows)
    torch.testing.assert_close(ours, expected, rtol=1e-4, atol=1e-4)


def test_transformers_defaults_when_the_config_is_silent():
    gemma2 = _config("Gemma2ForCausalLM")
    assert (gemma2.attn_softcap, gemma2.final_softcap, gemma2.head_dim) == (50.0, 30.0, 256)
    assert gemma2.attention_scale == 256 ** -0.5
    assert gemma2.layer_windows == (4096, None, 4096, None)
    off = _config("Gemma2ForCausalLM", attn_logit_softcapping=None, final_logit_softcapping=None)
    assert (off.attn_softcap, off.final_softcap) == (None, None)
    assert _config("Qwen3ForCausalLM").head_dim == 128
    assert _config("LlamaForCausalLM", attn_logit_softcapping=50.0).attn_softcap is None
