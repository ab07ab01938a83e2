"""Quantized linear layers for the CPU executor (`--quantization int8|int4`, and a GGUF
file's Q8_0/Q4_0/Q4_1/Q4_K weights kept as they are in the file).

The weights stay int8 (one scale per group of values along K) or int4 (a scale and a min per
group) in memory. Prompts (more than 8 rows) multiply float activations by tiles of W
dequantized to float32 (kernels/cpu/quant_matmul.cpp). Decode batches of up to 8 rows, by
default (`--quantized-activations int8`), round their activations to int8 per 32 values and
sum integer dot products (kernels/cpu/quant_dot.cpp), llama.cpp's scheme for its Q8_0/Q4
files: about 2x faster from 2 rows on, the same at one row (a step is bound by the bytes of
the weights there). An earlier W8A8 path with one activation scale per token (FBGEMM) cost
SmolLM2-135M 5% perplexity and was removed; per 32 values the rounding is far finer
(docs/benchmarks.md, "Quality of the quantized paths").
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

from folio.executor.quantization.groups import INT4_GROUP
from folio.kernels import cpu_quant
from folio.kernels.vnni_layout import repack, vnni_available, vnni_layout_fits



@dataclass(frozen=True)
class QuantizedWeight:
    """A [N, K] weight as the kernels read it: int8 `data` [N, K] (bits 8, `mins` None) or
    packed int4 `data` [N, K // 2] (bits 4); float32 `scales` (and `mins`) [N, K // group]."""
    bits: int
    data: torch.Tensor
    scales: torch.Tensor
    mins: torch.Tensor | None

    @property
    def shape(self) -> tuple[int, int]:
        return self.data.shape[0], self.data.shape[1] * (2 if self.bits == 4 else 1)

    @property
    def group(self) -> int:
        return self.shape[1] // self.scales.shape[1]

    def dequantize(self) -> torch.Tensor:
        if self.bits == 8:
            return cpu_quant.dequantize_int8(self.data, self.scales)
        return cpu_quant.dequantize_int4(self.data, self.scales, self.mins)

    @staticmethod
    def concatenate(parts: list[QuantizedWeight]) -> QuantizedWeight:
        """Row-wise concatenation (a fused qkv or gate_up from its parts)."""
        mins = None if parts[0].mins is None else torch.cat([p.mins for p in parts])
        return QuantizedWeight(parts[0].bits, torch.cat([p.data for p in parts]),
                               torch.cat([p.scales for p in parts]), mins)


def quantize_weight(weight: torch.Tensor, bits: int) -> QuantizedWeight:
    if bits == 8:
        q, scales = cpu_quant.quantize_int8(weight, weight.shape[1])
        return QuantizedWeight(8, q, scales, None)
    packed, scales, mins = cpu_quant.quantize_int4(weight, INT4_GROUP)
    return QuantizedWeight(4, packed, scales, mins)


class WeightOnlyLinear(nn.Module):
    """y = x @ dequant(W).T + b; x float32 or bfloat16, y in x's dtype."""

    def __init__(self, weight: QuantizedWeight, bias: torch.Tensor | None,
                 native: bool, int8_activations: bool = False) -> None:
        super().__init__()
        self.out_features, self.in_features = weight.shape
        self.bits = weight.bits
        self.group = weight.group
        # Without the built operators (kernels.cpu_attention), a float matmul on the weight
        # dequantized at each call: right, only slow.
        self.native = native
        asked = int8_activations and weight.shape[1] % cpu_quant.DOT_BLOCK == 0
        # Where the CPU has AVX-512 VNNI, one integer kernel takes every batch size, so a
        # row's result does not depend on its batch (kernels/cpu/vnni_gemm.cpp); the weights
        # are repacked for it here, once, in place of the file's layout.
        self.vnni = (asked and native and vnni_available()
                     and vnni_layout_fits(self.in_features, self.group))
        # Else small batches with int8 activations run kernels/cpu/quant_dot.cpp, whose sign
        # trick cannot take -128, which no quantizer here or in llama.cpp writes; a GGUF file
        # that holds one keeps float activations there.
        self.int8_activations = asked and (self.vnni or not (
            weight.bits == 8 and bool((weight.data == -128).any())))
        parts = (repack(weight.bits, weight.data, weight.scales, weight.mins) if self.vnni
                 else [weight.data, weight.scales, weight.mins])
        self.register_buffer("data", parts[0], persistent=False)
        self.register_buffer("scales", parts[1], persistent=False)
        self.register_buffer("mins", parts[2] if len(parts) > 2 else None, persistent=False)
        self.register_buffer("bias", bias, persistent=False)
        # The operator's operands, laid out once (kernels/cpu/weight_only_linear.cpp).
        self._operands, self._config = self.native_operands()

    @classmethod
    def from_linear(cls, linear: nn.Linear, bits: int, native: bool,
                    int8_activations: bool = False) -> WeightOnlyLinear:
        bias = None if linear.bias is None else linear.bias.detach().clone()
        return cls(quantize_weight(linear.weight, bits), bias, native, int8_activations)

    def quantized_weight(self) -> QuantizedWeight:
        """The weight in kernels/cpu_quant.py's layout (not available once repacked)."""
        if self.vnni:
            raise ValueError("this layer's weights are repacked for the VNNI kernel")
        return QuantizedWeight(self.bits, self.data, self.scales, self.mins)

    def native_operands(self) -> tuple[list[torch.Tensor], list[int]]:
        """(operands, config) of folio::weight_only_linear for this layer: config = [bits,
        group, int8_activations, has_bias, layout (1: VNNI), N]; operands = [data, scales,
        (mins), (bias)]."""
        operands = [self.data, self.scales]
        if self.bits == 4:
            operands.append(self.mins)
        if self.bias is not None:
            operands.append(self.bias.float())
        return operands, [self.bits, self.group, int(self.int8_activations),
                          int(self.bias is not None), int(self.vnni), self.out_features]

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if not self.native:
            out = x.float() @ self.quantized_weight().dequantize().T
            if self.bias is not None:
                out = out + self.bias.float()
            return out.to(x.dtype)
        flat = x.reshape(-1, self.in_features).float().contiguous()
        out = torch.ops.folio.weight_only_linear(flat, self._operands, self._config)
        return out.to(x.dtype).reshape(*x.shape[:-1], self.out_features)

    def extra_repr(self) -> str:
        return (f"in_features={self.in_features}, out_features={self.out_features}, "
                f"int{self.bits}, group={self.group}, "
                f"{'int8' if self.int8_activations else 'float'} activations"
                f"{', VNNI' if self.vnni else ''}")
