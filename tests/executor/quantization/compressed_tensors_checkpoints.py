"""compressed-tensors checkpoints made by the library itself (PyPI `compressed-tensors`), the
way llm-compressor makes them: a transformers model, the library's apply_quantization_config,
each layer's scale and zero point from the library's calculate_qparams over the weight's own
min and max (what llm-compressor's min-max observer does), then the library's ModelCompressor
compresses the model, save_pretrained writes it and update_config writes config.json's
quantization_config."""

from __future__ import annotations

import shutil
from pathlib import Path

import torch
from compressed_tensors.compressors import ModelCompressor
from compressed_tensors.quantization import (QuantizationArgs, QuantizationConfig,
                                             QuantizationScheme, apply_quantization_config)
from compressed_tensors.quantization.utils import calculate_qparams
from safetensors.torch import load_file, save_file
from transformers import AutoModelForCausalLM, CompressedTensorsConfig

from tests.conftest import TOKENIZER_FILES


def _weights(bits: int, strategy: str, group: int | None = None, symmetric: bool = True
             ) -> QuantizationArgs:
    return QuantizationArgs(num_bits=bits, type="int", symmetric=symmetric, strategy=strategy,
                            group_size=group)


_TOKEN_INT8 = QuantizationArgs(num_bits=8, type="int", symmetric=True, strategy="token",
                               dynamic=True)

# name -> (format, weight args, input activation args): the schemes Folio claims to load
# (llm-compressor's W4A16, W8A16 and W8A8 presets, with their group, channel and tensor
# strategies), and one it refuses (W4A16_ASYM: asymmetric, zero points in the file).
SCHEMES = {
    "w4a16_group": ("pack-quantized", _weights(4, "group", 32), None),
    "w4a16_channel": ("pack-quantized", _weights(4, "channel"), None),
    "w8a16_channel": ("pack-quantized", _weights(8, "channel"), None),
    "w8a16_group": ("pack-quantized", _weights(8, "group", 64), None),
    "w8a8_channel": ("int-quantized", _weights(8, "channel"), _TOKEN_INT8),
    "w8a8_tensor": ("int-quantized", _weights(8, "tensor"), _TOKEN_INT8),
    "w4a16_asym": ("pack-quantized", _weights(4, "group", 32, symmetric=False), None),
}


def _observed_range(weight: torch.Tensor, args: QuantizationArgs
                    ) -> tuple[torch.Tensor, torch.Tensor]:
    """The weight's min and max in the shape of its scale (per tensor, channel or group)."""
    if args.strategy == "tensor":
        return weight.amin().reshape(1), weight.amax().reshape(1)
    if args.strategy == "channel":
        return weight.amin(1, keepdim=True), weight.amax(1, keepdim=True)
    rows, cols = weight.shape
    grouped = weight.reshape(rows, cols // args.group_size, args.group_size)
    return grouped.amin(-1), grouped.amax(-1)


def make_checkpoint(source: Path, out: Path, scheme_name: str) -> Path:
    """`source` (a float checkpoint) quantized and compressed by compressed-tensors into
    `out`, in bfloat16 as llm-compressor's examples run (bfloat16 scales)."""
    fmt, weights, activations = SCHEMES[scheme_name]
    model = AutoModelForCausalLM.from_pretrained(str(source), dtype=torch.bfloat16)
    scheme = QuantizationScheme(targets=["Linear"], weights=weights,
                                input_activations=activations, format=fmt)
    apply_quantization_config(model, QuantizationConfig(config_groups={"group_0": scheme},
                                                        ignore=["lm_head"]))
    with torch.no_grad():
        for module in model.modules():
            if hasattr(module, "weight_scale"):
                low, high = _observed_range(module.weight, weights)
                scale, zero_point = calculate_qparams(low, high, weights)
                module.weight_scale.copy_(scale.reshape(module.weight_scale.shape))
                module.weight_zero_point.copy_(zero_point.reshape(
                    module.weight_zero_point.shape))
    compressor = ModelCompressor.from_pretrained_model(model, quantization_format=fmt)
    compressor.compress_model(model)
    model.save_pretrained(str(out))
    compressor.update_config(str(out))
    for file in TOKENIZER_FILES:
        if (source / file).exists():
            shutil.copy(source / file, out / file)
    return out


def library_decompressed(path: Path) -> torch.nn.Module:
    """transformers' loading of the checkpoint decompressed by compressed-tensors into a
    float32 model: the library's own dequantized model. The library multiplies in the scales'
    dtype, so bfloat16 scales give each weight rounded to bfloat16."""
    return AutoModelForCausalLM.from_pretrained(
        str(path), dtype=torch.float32,
        quantization_config=CompressedTensorsConfig(dequantize=True)).eval()


def widen_scales(path: Path, out: Path) -> Path:
    """A copy of the checkpoint whose bfloat16 scales are float32 (the same values), so that
    the library decompresses each weight in float32, q * s unrounded."""
    shutil.copytree(path, out)
    tensors = load_file(str(out / "model.safetensors"))
    save_file({name: tensor.float() if name.endswith("weight_scale") else tensor
               for name, tensor in tensors.items()}, str(out / "model.safetensors"),
              metadata={"format": "pt"})
    return out
