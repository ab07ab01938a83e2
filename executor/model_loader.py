"""Builds Folio's model from a Hugging Face checkpoint directory or a GGUF file (its tensors
renamed and dequantized by executor/quantization/gguf/weights.py). A pre-quantized checkpoint's quantized
layers are left without a weight here: executor/quantization/prequantized.py swaps in quantized ones."""

from __future__ import annotations

import logging
from pathlib import Path

import torch
from torch import nn

from folio.executor.materialize import materialize
from folio.executor.model_config import ModelConfig
from folio.executor.models.architectures import ARCHITECTURES
from folio.executor.models.decoder import CausalLM
from folio.executor.models.describe import describe
from folio.executor.models.layers import hold_stored_scales
from folio.executor.models.gpt_oss.mxfp4 import dequantize_stream
from folio.executor.ops import KernelOps
from folio.executor.quantization.gguf.file import is_gguf
from folio.executor.quantization.prequantized import leave_unallocated, quantized_module, quantized_params
from folio.executor.weights import iterate_weights

log = logging.getLogger("folio.executor")


def load_model(model_dir: str | Path, config: ModelConfig, ops: KernelOps, dtype: torch.dtype,
               device: torch.device, max_positions: int, tp=None,
               needs_lm_head: bool = True) -> nn.Module:
    """`tp` (executor/parallel/sharding.py's TensorParallel): `config` is this rank's share, and
    each tensor is sliced to this rank's part as it streams in. `needs_lm_head` False: an
    embedding model (executor/pooling/), whose checkpoint may have no LM head. With config.prequantized,
    the layers the file holds quantized get no float weight and their tensors are skipped."""
    if config.hybrid is not None:   # its own modules and names (executor/models/hybrid/)
        from folio.executor.models.hybrid.loader import load_hybrid_model

        model = load_hybrid_model(model_dir, config, ops, dtype, device, max_positions)
        log.info("model: %s", describe(config))
        return model
    if config.gemma4 is not None:   # per-layer head sizes, shared KV (executor/models/gemma4/)
        from folio.executor.models.gemma4.loader import load_gemma4_model

        model = load_gemma4_model(model_dir, config, ops, dtype, device, max_positions)
        log.info("model: %s", describe(config))
        return model
    arch = ARCHITECTURES[config.architecture]
    weight_names = arch.weights
    with torch.device("meta"):
        model = CausalLM(config, ops, max_positions)
        if tp is not None:
            tp.parallelize(model)
    if config.prequantized is not None:   # no float weight for the layers held quantized
        leave_unallocated(model, quantized_params(model_dir, weight_names))
    model = materialize(model, device, dtype)
    if config.gemma and is_gguf(model_dir):   # its norms stored as their scale 1 + w
        hold_stored_scales(model)
    params = dict(model.named_parameters())
    filled = dict.fromkeys(params, 0)   # elements written, to tell a complete checkpoint
    seen: set[tuple] = set()
    weights = iterate_weights(model_dir)
    if arch.mxfp4_experts:   # gpt-oss's released experts: 4-bit blocks, multiplied out here
        weights = dequantize_stream(weights)
    for name, tensor in weights:
        if config.prequantized is not None and quantized_module(name, tensor,
                                                                config.prequantized):
            continue   # executor/quantization/prequantized.py reads it
        target = weight_names.target(name)
        if target is None:
            continue
        param_name, expert, part = target
        if param_name not in params:
            raise ValueError(f"checkpoint tensor {name!r} has no place in {config.architecture}")
        if target in seen:
            raise ValueError(f"checkpoint tensor {name!r} fills a place already filled")
        seen.add(target)
        if tp is not None:
            tensor = tp.shard(param_name, part, tensor)
        filled[param_name] += _copy_into(params[param_name], tensor, expert, part,
                                         _fused_sizes(param_name, params[param_name], expert,
                                                      config))
    if config.tie_word_embeddings:
        model.lm_head.weight = model.embed_tokens.weight
        filled.pop("lm_head.weight", None)
    if not needs_lm_head and not filled.get("lm_head.weight"):
        filled.pop("lm_head.weight", None)   # never read: the pooled rows are hidden states
    missing = [name for name, count in filled.items() if count != params[name].numel()]
    if missing:
        raise ValueError(f"checkpoint is missing {len(missing)} tensor(s) or part(s) of them, "
                         f"e.g. {missing[:3]}")
    model.init_rotary()
    log.info("model: %s", describe(config))
    return model.eval()


def _copy_into(param: torch.Tensor, tensor: torch.Tensor, expert: int | None,
               part: int | None, sizes: list[int]) -> int:
    """Copy `tensor` into its place in `param`; returns the elements written."""
    with torch.no_grad():
        dest = param
        if expert is not None:
            if not 0 <= expert < param.shape[0]:
                raise ValueError(f"expert {expert} out of range (the config has "
                                 f"{param.shape[0]})")
            dest = param[expert]
        if part is not None:
            offset = sum(sizes[:part])
            dest = dest[offset:offset + sizes[part]]
        if dest.shape != tensor.shape:
            raise ValueError(f"shape mismatch: checkpoint {tuple(tensor.shape)} vs model "
                             f"{tuple(dest.shape)}" + ("" if part is None else
                                                       f" (fused slice {part})"))
        dest.copy_(tensor)
        return dest.numel()


def _fused_sizes(name: str, param: torch.Tensor, expert: int | None,
                 config: ModelConfig) -> list[int]:
    """Row counts of the slices of a fused parameter: q, k, v or gate, up."""
    if ".qkv_proj." in name:
        kv = config.num_kv_heads * config.head_dim
        return [config.num_heads * config.head_dim, kv, kv]
    rows = param.shape[1] if expert is not None else param.shape[0]
    return [rows // 2, rows // 2]
