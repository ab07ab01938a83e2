"""Builds Folio's model from a Hugging Face checkpoint directory."""

from __future__ import annotations

import re
from pathlib import Path

import torch

from executor.model_config import ModelConfig
from executor.models.llama import LlamaForCausalLM
from executor.ops import KernelOps
from executor.weights import iterate_weights

_LAYER = re.compile(r"^model\.layers\.(\d+)\.(.+)$")
# Checkpoint tensors that Folio stores fused: (fused parameter, its slices in order).
_FUSED = {
    "self_attn.q_proj": ("self_attn.qkv_proj", 0),
    "self_attn.k_proj": ("self_attn.qkv_proj", 1),
    "self_attn.v_proj": ("self_attn.qkv_proj", 2),
    "mlp.gate_proj": ("mlp.gate_up_proj", 0),
    "mlp.up_proj": ("mlp.gate_up_proj", 1),
}


def load_model(model_dir: str | Path, config: ModelConfig, ops: KernelOps, dtype: torch.dtype,
               device: torch.device, max_positions: int) -> LlamaForCausalLM:
    with torch.device("meta"):
        model = LlamaForCausalLM(config, ops, max_positions)
    model = model.to_empty(device=device).to(dtype)
    params = dict(model.named_parameters())
    loaded: set[str] = set()
    for name, tensor in iterate_weights(model_dir):
        target, part = _target(name)
        if target is None:
            continue
        if target not in params:
            raise ValueError(f"checkpoint tensor {name!r} has no place in {config.architecture}")
        _copy_into(params[target], tensor, part, _fused_sizes(target, config))
        loaded.add(target if part is None else f"{target}#{part}")
    if config.tie_word_embeddings:
        model.lm_head.weight = model.embed_tokens.weight
        loaded.add("lm_head.weight")
    _check_complete(params, loaded, config)
    model.init_rotary()
    return model.eval()


def _target(name: str) -> tuple[str | None, int | None]:
    if name.endswith("rotary_emb.inv_freq"):
        return None, None
    if name.startswith("lm_head."):
        return name, None
    match = _LAYER.match(name)
    if match is None:
        return name.removeprefix("model."), None
    index, rest = match.groups()
    module, _, leaf = rest.rpartition(".")
    if module in _FUSED:
        fused, part = _FUSED[module]
        return f"layers.{index}.{fused}.{leaf}", part
    return f"layers.{index}.{rest}", None


def _copy_into(param: torch.Tensor, tensor: torch.Tensor, part: int | None,
               sizes: list[int]) -> None:
    with torch.no_grad():
        if part is None:
            if param.shape != tensor.shape:
                raise ValueError(f"shape mismatch: checkpoint {tuple(tensor.shape)} vs model "
                                 f"{tuple(param.shape)}")
            param.copy_(tensor)
            return
        offset = sum(sizes[:part])
        if tensor.shape[0] != sizes[part]:
            raise ValueError(f"shape mismatch in fused slice {part}: {tuple(tensor.shape)}")
        param[offset:offset + sizes[part]].copy_(tensor)


def _fused_sizes(target: str, config: ModelConfig) -> list[int]:
    if ".qkv_proj." in target:
        kv = config.num_kv_heads * config.head_dim
        return [config.num_heads * config.head_dim, kv, kv]
    return [config.intermediate_size, config.intermediate_size]


def _check_complete(params: dict[str, torch.Tensor], loaded: set[str],
                    config: ModelConfig) -> None:
    missing = []
    for name, param in params.items():
        if name == "lm_head.weight" and config.tie_word_embeddings:
            continue
        parts = 3 if "qkv_proj" in name else 2 if "gate_up_proj" in name else 0
        wanted = [f"{name}#{i}" for i in range(parts)] if parts else [name]
        missing.extend(w for w in wanted if w not in loaded)
    if missing:
        raise ValueError(f"checkpoint is missing {len(missing)} tensor(s), e.g. {missing[:3]}")
