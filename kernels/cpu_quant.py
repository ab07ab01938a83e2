"""Python faces of the weight-only quantized matmuls in kernels/cpu/quant_matmul.cpp, and the
formats they read.

int8: q int8 [N, K], one float32 scale per group of `group` values along K (w = q * scale;
group = K is per channel, group = 32 is GGUF Q8_0). int4: values 0..15 two per byte, a float32
scale and min per group (w = q * scale + min; Q4_0 is min = -8 * scale); each 32 values along
K are 16 bytes, byte i holding value i (low nibble) and value i + 16 (high nibble), as GGUF's
Q4_0/Q4_1 blocks. The operators are built and loaded with the attention operator
(kernels.cpu_attention), so `cpu_attention.load().ok` says whether they can run.
"""

from __future__ import annotations

import torch

INT8_MAX = 127
INT4_MAX = 15
INT4_BLOCK = 32   # values per packed block (16 bytes)


def quantize_int8(weight: torch.Tensor, group: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(q int8 [N, K], scales float32 [N, K // group]), symmetric per group:
    scale = max|w| / 127 over the group."""
    n, k = weight.shape
    grouped = weight.detach().float().reshape(n, k // group, group)
    scales = grouped.abs().amax(dim=2).clamp(min=1e-12) / INT8_MAX
    q = torch.round(grouped / scales[..., None]).clamp(-INT8_MAX, INT8_MAX).to(torch.int8)
    return q.reshape(n, k), scales.contiguous()


def quantize_int4(weight: torch.Tensor, group: int
                  ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(packed uint8 [N, K // 2], scales, mins float32 [N, K // group]), asymmetric per
    group: min = the group's least value, scale = its range / 15 (both ends exact)."""
    n, k = weight.shape
    grouped = weight.detach().float().reshape(n, k // group, group)
    low = grouped.amin(dim=2)
    scales = ((grouped.amax(dim=2) - low) / INT4_MAX).clamp(min=1e-12)
    q = torch.round((grouped - low[..., None]) / scales[..., None]).clamp(0, INT4_MAX)
    return pack_int4(q.reshape(n, k).to(torch.uint8)), scales.contiguous(), low.contiguous()


def pack_int4(values: torch.Tensor) -> torch.Tensor:
    """uint8 [N, K] of 0..15 -> [N, K // 2] in the kernel's (GGUF's) block layout."""
    n, k = values.shape
    blocks = values.reshape(n, k // INT4_BLOCK, 2, INT4_BLOCK // 2)
    return (blocks[:, :, 0] | (blocks[:, :, 1] << 4)).reshape(n, k // 2).contiguous()


def unpack_int4(packed: torch.Tensor) -> torch.Tensor:
    """The inverse of pack_int4: uint8 [N, K] of 0..15."""
    n, half = packed.shape
    blocks = packed.reshape(n, half * 2 // INT4_BLOCK, 1, INT4_BLOCK // 2)
    return torch.cat((blocks & 0xF, blocks >> 4), dim=2).reshape(n, half * 2)


def quantize_activations(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """x float32 [M, K] as kernels/cpu/quant_dot.cpp rounds it: (q int8 [M, K], scales
    float32 [M, K // 32]), per 32 values scale = max|x| / 127, q = round-half-even(x * 127 /
    max|x|) (0 for a block of zeros)."""
    m, k = x.shape
    blocks = x.float().reshape(m, k // DOT_BLOCK, DOT_BLOCK)
    amax = blocks.abs().amax(dim=2)
    inverse = torch.where(amax > 0, INT8_MAX / amax, torch.zeros_like(amax))
    q = torch.round(blocks * inverse[..., None]).to(torch.int8)
    return q.reshape(m, k), amax / INT8_MAX


def dequantize_int8(q: torch.Tensor, scales: torch.Tensor) -> torch.Tensor:
    n, k = q.shape
    group = k // scales.shape[1]
    return (q.float().reshape(n, -1, group) * scales[..., None]).reshape(n, k)


def dequantize_int4(packed: torch.Tensor, scales: torch.Tensor,
                    mins: torch.Tensor) -> torch.Tensor:
    values = unpack_int4(packed).float()
    n, k = values.shape
    group = k // scales.shape[1]
    return torch.addcmul(mins[..., None], values.reshape(n, -1, group),
                         scales[..., None]).reshape(n, k)


# Values per activation scale and per integer dot product in kernels/cpu/quant_dot.cpp.
DOT_BLOCK = 32
def small_batch() -> int:
    """Rows of x up to which the AVX2 register-blocked kernels run; above, tiles of W
    dequantized to float32 go through a float GEMM. kernels/cpu/weight_only_linear.cpp's
    kSmallBatch decides (bench/quantized_decode.py --kernels: at 64 rows and more the GEMM on
    a dequantized tile ran about 2x faster than the kernel, at 8 rows about as fast); the
    VNNI kernel takes every batch size."""
    return int(torch.ops.folio.weight_only_small_batch())


def quant_matmul_int8(x: torch.Tensor, q: torch.Tensor, scales: torch.Tensor,
                      int8_activations: bool = False) -> torch.Tensor:
    """x [..., K] (float32 or bfloat16) @ dequantize_int8(q, scales).T, in float32, returned
    in x's dtype, through folio::weight_only_linear as the layers call it (the file's
    layout). With int8_activations, a small batch runs kernels/cpu/quant_dot.cpp: x
    quantized per 32 values, integer dot products (q must not hold -128 then)."""
    return _weight_only(x, [q, scales], 8, q.shape[1] // scales.shape[1], int8_activations,
                        q.shape[0])


def quant_matmul_int4(x: torch.Tensor, packed: torch.Tensor, scales: torch.Tensor,
                      mins: torch.Tensor, int8_activations: bool = False) -> torch.Tensor:
    """x [..., K] @ dequantize_int4(packed, scales, mins).T, as quant_matmul_int8."""
    return _weight_only(x, [packed, scales, mins], 4, packed.shape[1] * 2 // scales.shape[1],
                        int8_activations, packed.shape[0])


def _weight_only(x: torch.Tensor, operands: list[torch.Tensor], bits: int, group: int,
                 int8_activations: bool, n: int) -> torch.Tensor:
    k = x.shape[-1]
    flat = x.reshape(-1, k).float().contiguous()
    config = [bits, group, int(int8_activations), 0, 0, n]   # no bias, the file's layout
    out = torch.ops.folio.weight_only_linear(flat, operands, config)
    return out.to(x.dtype).reshape(*x.shape[:-1], n)
