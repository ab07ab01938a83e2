"""Tiny random Gemma 4 text checkpoints, made by transformers itself, with the shared test
tokenizer: six layers, two of them global (their own head size and KV heads), in the
variants Folio must tell apart (KV sharing, values = keys, per-layer inputs, the MoE
block)."""

from __future__ import annotations

import shutil
from pathlib import Path

from tests.conftest import TOKENIZER_FILES

_BASE = dict(vocab_size=1024, hidden_size=64, intermediate_size=96, num_hidden_layers=6,
             num_attention_heads=4, num_key_value_heads=2, head_dim=16, global_head_dim=32,
             sliding_window=16, max_position_embeddings=1024, initializer_range=0.1,
             layer_types=["sliding_attention", "sliding_attention", "full_attention",
                          "sliding_attention", "sliding_attention", "full_attention"],
             bos_token_id=None, eos_token_id=0, pad_token_id=0)
VARIANTS = {
    # Every layer keeps its own cache; no per-layer inputs.
    "plain": dict(hidden_size_per_layer_input=0),
    # The last two layers read layers 3 and 2's caches; double-wide MLPs there; PLE.
    "shared_kv_ple": dict(num_kv_shared_layers=2, use_double_wide_mlp=True,
                          hidden_size_per_layer_input=8, vocab_size_per_layer_input=1024),
    # Global layers: values = keys' projection, one KV head; final logit softcap; the MoE
    # block (26B-A4B's routed experts beside each dense MLP).
    "k_eq_v": dict(attention_k_eq_v=True, num_global_key_value_heads=1,
                   hidden_size_per_layer_input=8, vocab_size_per_layer_input=1024,
                   final_logit_softcapping=30.0, enable_moe_block=True, num_experts=4,
                   top_k_experts=2, moe_intermediate_size=32),
}


# Beside VARIANTS (not in the parity tests' sweep): k_eq_v without the MoE block, whose
# values = keys layers the native step runs (it leaves the MoE block to the Python layers).
EXTRA_VARIANTS = {
    "k_eq_v_dense": {**VARIANTS["k_eq_v"], "enable_moe_block": False},
    # KV sharing llama.cpp reads as transformers does (its shared layers read the last
    # kept global layer and the one before it, sliding): the last three layers share.
    "shared_kv_last_three": {**VARIANTS["shared_kv_ple"], "num_kv_shared_layers": 3},
}


_ONES = ("norm.weight", "layer_scalar", "router.scale", "router.per_expert_scale")


def make_gemma4_dir(path: Path, tokenizer_dir: Path, variant: str, seed: int = 0) -> Path:
    import torch
    import transformers as hf

    for file in TOKENIZER_FILES:
        if (tokenizer_dir / file).exists():
            shutil.copy(tokenizer_dir / file, path / file)
    config = hf.Gemma4TextConfig(**_BASE, **{**VARIANTS, **EXTRA_VARIANTS}[variant])
    torch.manual_seed(seed)
    model = hf.Gemma4ForCausalLM(config)
    with torch.no_grad():   # norms, scales and layer scalars start at one: perturbed, so a
        for name, tensor in list(model.named_parameters()) + list(model.named_buffers()):
            if name.endswith(_ONES):   # misplaced one shows
                tensor.add_(torch.randn_like(tensor) * 0.2)
    model.save_pretrained(str(path), safe_serialization=True)
    return path


def make_gemma4_multimodal_dir(path: Path, tokenizer_dir: Path, variant: str,
                               seed: int = 0) -> Path:
    """A Gemma4ForConditionalGeneration checkpoint: the text model of `variant` under
    model.language_model., beside a one-layer vision tower."""
    import torch
    import transformers as hf

    for file in TOKENIZER_FILES:
        if (tokenizer_dir / file).exists():
            shutil.copy(tokenizer_dir / file, path / file)
    vision = hf.Gemma4VisionConfig(hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                                   num_attention_heads=2, num_key_value_heads=2, head_dim=16)
    config = hf.Gemma4Config(text_config=hf.Gemma4TextConfig(**_BASE, **VARIANTS[variant]),
                             vision_config=vision, audio_config=None)
    torch.manual_seed(seed)
    model = hf.Gemma4ForConditionalGeneration(config)
    with torch.no_grad():
        for name, tensor in list(model.named_parameters()) + list(model.named_buffers()):
            if name.endswith(_ONES):
                tensor.add_(torch.randn_like(tensor) * 0.2)
    model.save_pretrained(str(path), safe_serialization=True)
    return path
