"""Issue 39's attention-only families (SmolLM3, OLMo 3, gpt-oss) beyond the batch parity of
test_models_parity.py: a second request sharing a long prefix hits the prefix cache and still
gives transformers' tokens, n=2 children each give them, the native decode step stands aside
naming why, every block is free when idle; and gpt-oss's MXFP4 experts dequantize as
transformers dequantizes them and load into the same model."""

from __future__ import annotations

import json
import math
import random

import pytest
import torch

from folio import LLM, SamplingParams
from folio.executor.models.gpt_oss.mxfp4 import dequantize_mxfp4
from tests.conftest import TEST_DEVICE, _model_dir
from tests.executor.test_models_parity import ARCHS
from tests.hf_oracle import hf_greedy

pytestmark = pytest.mark.parity

FAMILIES = {"smollm3": "layers without rotary", "olmo3": "post-sublayer norms",
            "gpt_oss": "MoE layers"}   # the first reason select.py finds


def _prompts(seed: int) -> tuple[list[list[int]], list[int]]:
    rng = random.Random(seed)
    prefix = [rng.randrange(3, 1024) for _ in range(70)]   # past the windows, 4 full blocks
    return [prefix + [rng.randrange(3, 1024) for _ in range(n)] for n in (9, 5)], [12, 10]


@pytest.mark.parametrize("arch", FAMILIES)
def test_prefix_hit_and_forks_match_transformers(arch, tmp_path_factory, tokenizer_dir,
                                                 caplog):
    model_dir = _model_dir(tmp_path_factory, tokenizer_dir, f"{arch}_prefix", **ARCHS[arch])
    prompts, max_tokens = _prompts(seed=len(arch))
    expected = hf_greedy(model_dir, prompts, max_tokens, TEST_DEVICE)
    with caplog.at_level("INFO", logger="folio.executor"):
        llm = LLM(str(model_dir), dtype="float32", device=TEST_DEVICE, num_kv_blocks=64)
    if TEST_DEVICE == "cpu":
        assert f"decode step: Python layers ({FAMILIES[arch]})" in caplog.text
    first = llm.generate([prompts[0]], SamplingParams(temperature=0.0,
                                                      max_tokens=max_tokens[0]))[0]
    assert first.outputs[0].token_ids == expected[0]
    # The second prompt shares 70 tokens: its first 4 blocks come from the cache; n=2.
    second = llm.generate([prompts[1]], SamplingParams(n=2, temperature=0.0,
                                                       max_tokens=max_tokens[1]))[0]
    assert [o.token_ids for o in second.outputs] == [expected[1]] * 2
    stats = llm.stats()
    assert stats["prefix_cache_hits"] >= 64
    assert stats["forks"] == 1
    assert stats["kv_blocks_free"] == stats["kv_blocks_total"]
    assert stats["num_running"] == stats["num_waiting"] == 0


def _quantize_mxfp4(weight: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """[E, out, in] values on the E2M1 grid times a power of two per 32 -> blocks, scales
    (the test's own encoder: nearest grid value, low nibble first)."""
    grid = torch.tensor([0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0])
    experts, rows, width = weight.shape
    groups = weight.reshape(experts, rows, width // 32, 32)
    exponent = torch.ceil(torch.log2(groups.abs().amax(-1).clamp(min=1e-30) / 6.0))
    scaled = groups / torch.exp2(exponent)[..., None]
    codes = (scaled.abs()[..., None] - grid).abs().argmin(-1) + 8 * (scaled < 0)
    codes = codes.to(torch.uint8).reshape(experts, rows, width // 32, 16, 2)
    blocks = codes[..., 0] | (codes[..., 1] << 4)
    return blocks, (exponent + 127).to(torch.uint8)


def test_mxfp4_dequantizes_as_transformers_does():
    from transformers.integrations.mxfp4 import convert_moe_packed_tensors

    generator = torch.Generator().manual_seed(0)
    blocks = torch.randint(0, 256, (3, 8, 2, 16), dtype=torch.uint8, generator=generator)
    scales = torch.randint(120, 134, (3, 8, 2), dtype=torch.uint8, generator=generator)
    expected = convert_moe_packed_tensors(blocks, scales, dtype=torch.float32)
    assert torch.equal(dequantize_mxfp4(blocks, scales), expected)
    with pytest.raises(ValueError, match="do not match"):
        dequantize_mxfp4(blocks, scales[..., :1])


def test_mxfp4_checkpoint_loads_as_its_dequantized_weights(tmp_path_factory, tokenizer_dir):
    """The same gpt-oss model, its experts written as MXFP4 blocks and scales with a
    quantization_config (as the released checkpoints are) or as the dequantized floats:
    Folio gives the same tokens from both, and transformers' from the float one."""
    from safetensors.torch import load_file, save_file

    model_dir = _model_dir(tmp_path_factory, tokenizer_dir, "gpt_oss_float", **ARCHS["gpt_oss"])
    tensors = load_file(str(model_dir / "model.safetensors"))
    packed = {}
    for name, tensor in tensors.items():
        if name.endswith(("experts.gate_up_proj", "experts.down_proj")):
            # [E, in, out] -> [E, out, in] blocks; then the float file holds their values.
            blocks, scales = _quantize_mxfp4(tensor.transpose(1, 2).contiguous())
            packed[name + "_blocks"], packed[name + "_scales"] = blocks, scales
            tensors[name] = dequantize_mxfp4(blocks, scales)
        else:
            packed[name] = tensor
    save_file(tensors, str(model_dir / "model.safetensors"), metadata={"format": "pt"})
    packed_dir = tmp_path_factory.mktemp("gpt_oss_mxfp4")
    for file in model_dir.iterdir():
        if file.name != "model.safetensors":
            (packed_dir / file.name).write_bytes(file.read_bytes())
    save_file(packed, str(packed_dir / "model.safetensors"), metadata={"format": "pt"})
    config = json.loads((packed_dir / "config.json").read_text())
    config["quantization_config"] = {"quant_method": "mxfp4",
                                     "modules_to_not_convert": ["model.layers.*.self_attn"]}
    (packed_dir / "config.json").write_text(json.dumps(config))

    prompts, max_tokens = [[5, 9, 200, 31, 7] * 4, [800, 3, 4]], [8, 8]
    expected = hf_greedy(model_dir, prompts, max_tokens, TEST_DEVICE)
    params = [SamplingParams(temperature=0.0, max_tokens=n) for n in max_tokens]
    for directory in (model_dir, packed_dir):
        llm = LLM(str(directory), dtype="float32", device=TEST_DEVICE, num_kv_blocks=64)
        assert [r.outputs[0].token_ids for r in llm.generate(prompts, params)] == expected


_BASE = dict(hidden_size=64, num_hidden_layers=4, num_attention_heads=4, num_key_value_heads=2,
             intermediate_size=128, vocab_size=1024, max_position_embeddings=4096)


def test_olmo3_flat_rope_scaling_scales_only_the_global_layers():
    """An OLMo 3 config.json as released (rope_theta and a flat yarn rope_scaling): the
    sliding layers keep the plain rope, the global ones get yarn, truncate on."""
    from folio.executor.models.hf_config import parse_model_config

    config = parse_model_config({**_BASE, "architectures": ["Olmo3ForCausalLM"],
                                 "rope_theta": 5e5,
                                 "rope_scaling": {"rope_type": "yarn", "factor": 8.0,
                                                  "original_max_position_embeddings": 512,
                                                  "truncate": False}})
    assert config.layer_windows == (4096, 4096, 4096, None)
    assert config.rope.rope_type == "yarn" and config.rope.truncate
    assert config.local_rope.rope_type == "default" and config.local_rope.theta == 5e5
    assert config.rope.attention_factor == pytest.approx(0.1 * math.log(8.0) + 1.0)
    assert config.layer_rope(0) is config.local_rope and config.layer_rope(3) is config.rope
