"""Tiny random checkpoints of the hybrid MoE families (Qwen3.5-MoE, Qwen3-Next, LFM2-MoE),
made by transformers itself, with the shared test tokenizer. Each exercises what sets its
routing apart: Qwen3-Next a dense first layer (mlp_only_layers) and top-k weights left
unnormalised; LFM2-MoE a dense first layer, a random expert bias and a routed scaling."""

from __future__ import annotations

import shutil
from pathlib import Path

from tests.conftest import TOKENIZER_FILES

_QWEN_LAYERS = dict(
    hidden_size=64, num_attention_heads=4, num_key_value_heads=2, head_dim=16,
    linear_num_key_heads=2, linear_num_value_heads=4, linear_key_head_dim=16,
    linear_value_head_dim=8, linear_conv_kernel_dim=4,
    layer_types=["linear_attention", "full_attention", "linear_attention"],
    num_experts=8, num_experts_per_tok=2, moe_intermediate_size=32,
    shared_expert_intermediate_size=48)
FAMILIES = {
    "qwen3_5_moe": ("Qwen3_5MoeTextConfig", "Qwen3_5MoeForCausalLM", dict(
        _QWEN_LAYERS, rope_parameters={"rope_type": "default", "rope_theta": 10000.0,
                                       "partial_rotary_factor": 0.5,
                                       "mrope_section": [2, 1, 1]})),
    "qwen3_next": ("Qwen3NextConfig", "Qwen3NextForCausalLM", dict(
        _QWEN_LAYERS, intermediate_size=96, mlp_only_layers=[0], norm_topk_prob=False,
        rope_parameters={"rope_type": "default", "rope_theta": 10000.0,
                         "partial_rotary_factor": 0.5})),
    "lfm2_moe": ("Lfm2MoeConfig", "Lfm2MoeForCausalLM", dict(
        hidden_size=64, intermediate_size=96, num_attention_heads=4, num_key_value_heads=2,
        conv_L_cache=3, layer_types=["conv", "full_attention", "conv"], num_experts=8,
        num_experts_per_tok=2, moe_intermediate_size=32, num_dense_layers=1,
        use_expert_bias=True, routed_scaling_factor=2.5)),
}


def make_moe_model(family: str, seed: int = 0, **overrides):
    """The transformers model itself, its weights random (norms and expert biases too);
    `overrides` replace config fields."""
    import torch
    import transformers as hf

    config_name, model_name, fields = FAMILIES[family]
    fields = {**fields, **overrides}
    config = getattr(hf, config_name)(**{
        "vocab_size": 1024, "num_hidden_layers": len(fields["layer_types"]),
        "max_position_embeddings": 1024, "tie_word_embeddings": False,
        "initializer_range": 0.1, "bos_token_id": None, "eos_token_id": 0,
        "pad_token_id": 0, **fields})
    torch.manual_seed(seed)
    model = getattr(hf, model_name)(config)
    with torch.no_grad():   # constant at start: perturbed, so a misplaced one shows
        for name, tensor in model.state_dict().items():
            if name.endswith("norm.weight"):
                tensor.add_(torch.randn_like(tensor) * 0.2)
            elif name.endswith("expert_bias"):
                tensor.copy_(torch.randn_like(tensor) * 0.5)
    return model


def copy_tokenizer(path: Path, tokenizer_dir: Path) -> None:
    for file in TOKENIZER_FILES:
        if (tokenizer_dir / file).exists():
            shutil.copy(tokenizer_dir / file, path / file)


def make_moe_dir(path: Path, tokenizer_dir: Path, family: str, seed: int = 0,
                 **overrides) -> Path:
    copy_tokenizer(path, tokenizer_dir)
    make_moe_model(family, seed, **overrides).save_pretrained(str(path),
                                                               safe_serialization=True)
    return path
