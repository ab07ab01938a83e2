"""Which weight format each linear layer runs in, chosen once after the float model is built.

In order: a pre-quantized checkpoint's layers stay as the file holds them (CPU, one rank);
a GGUF file's Q8_0/Q4_x layers stay quantized (CPU, one rank); every other linear layer is
packed for the fastest matmul the device has, or quantized by `--quantization`
(executor/linear.py)."""

from __future__ import annotations

import logging
from dataclasses import dataclass

import torch
from torch import nn

from folio.executor.linear import pack_linears
from folio.executor.model_config import ModelConfig
from folio.executor.models.architectures import ARCHITECTURES
from folio.executor.quantization.gguf.file import is_gguf
from folio.executor.quantization.gguf.quantized import keep_gguf_quantized
from folio.executor.quantization.prequantized import keep_prequantized
from folio.executor.quantization.weight_only_linear import WeightOnlyLinear
from folio.kernels import cpu_attention
from folio.shared.config import EngineConfig

log = logging.getLogger("folio.executor")


@dataclass(frozen=True)
class WeightFormat:
    linear_backend: str   # what pack_linears chose: "onednn", "torch", "int8", "int4", ...
    num_params: int       # every weight, the quantized ones too (the planner's cost model)


def apply_weight_format(model: nn.Module, config: EngineConfig, model_config: ModelConfig,
                        device: torch.device, dtype: torch.dtype, tp=None) -> WeightFormat:
    num_params = sum(p.numel() for p in model.parameters())
    int8_activations = config.quantized_activations == "int8"
    weight_names = ARCHITECTURES[model_config.architecture].weights
    if model_config.hybrid is not None:   # its modules carry the checkpoint's names
        from folio.executor.models.hybrid.loader import HybridWeightNames

        weight_names = HybridWeightNames
    if model_config.gemma4 is not None:   # its modules' names, q alone on KV-shared layers
        from folio.executor.quantization.gguf.gemma4.quantized import Gemma4WeightNames

        weight_names = Gemma4WeightNames(model_config.gemma4.kv_source)
    if model_config.prequantized is not None:
        if device.type != "cpu" or tp is not None:
            raise ValueError("a pre-quantized checkpoint runs on the CPU executor only, "
                             "on one rank")
        keep_prequantized(model, config.model, model_config.prequantized, weight_names,
                          cpu_attention.load().ok, int8_activations)
        num_params += sum(m.in_features * m.out_features for m in model.modules()
                          if isinstance(m, WeightOnlyLinear))
        if config.quantization != "none":
            log.info("--quantization %s: only the layers the pre-quantized checkpoint "
                     "holds in float are quantized", config.quantization)
    elif is_gguf(config.model) and device.type == "cpu" and tp is None:
        keep_gguf_quantized(model, config.model, weight_names, cpu_attention.load().ok,
                            model_config.tie_word_embeddings, int8_activations)
    backend = pack_linears(model, device, dtype, config.linear_backend, config.quantization,
                           int8_activations)
    return WeightFormat(backend, num_params)
