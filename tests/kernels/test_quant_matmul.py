"""The weight-only quantized matmuls (kernels/cpu/quant_matmul.cpp, the build's own ISA path:
AVX-512 or AVX2 here) against a float64 product with the dequantized weight, for both formats,
every batch class (one row, register blocks, tiles, a prefill chunk), odd N and K at the
group limits; and the formats' packing and quantization error."""

from __future__ import annotations

import pytest
import torch

from folio.kernels.cpu_quant import (dequantize_int4, dequantize_int8, pack_int4,
                                     quant_matmul_int4, quant_matmul_int8, quantize_int4,
                                     quantize_int8, unpack_int4)

pytestmark = pytest.mark.usefixtures("cpu_ops_built")

ROWS = [1, 3, 4, 5, 8, 64, 130]


def expected(x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    return x.double() @ weight.double().T


def assert_close_to(out: torch.Tensor, want: torch.Tensor, x: torch.Tensor) -> None:
    # float32 accumulation over K: the error grows with the size of the terms summed.
    scale = x.double().abs() @ torch.ones(x.shape[1], 1, dtype=torch.float64)
    assert ((out.double() - want).abs() <= 1e-5 * scale + 1e-5).all()


@pytest.mark.parametrize("rows", ROWS)
@pytest.mark.parametrize("n,k,group", [(37, 64, 32), (50, 96, 96), (9, 70, 70), (130, 256, 128),
                                       (3, 32, 32), (17, 48, 16)])
def test_int8_matches_float64(rows, n, k, group):
    torch.manual_seed(rows * 1000 + n)
    q = torch.randint(-127, 128, (n, k), dtype=torch.int8)
    scales = torch.rand(n, k // group) * 0.01 + 1e-3
    x = torch.randn(rows, k)
    out = quant_matmul_int8(x, q, scales)
    assert out.shape == (rows, n) and out.dtype == torch.float32
    assert_close_to(out, expected(x, dequantize_int8(q, scales)), x)


@pytest.mark.parametrize("rows", ROWS)
@pytest.mark.parametrize("n,k,group", [(37, 64, 32), (50, 128, 64), (9, 256, 128),
                                       (130, 576, 64), (1, 32, 32)])
def test_int4_matches_float64(rows, n, k, group):
    torch.manual_seed(rows * 1000 + n)
    values = torch.randint(0, 16, (n, k), dtype=torch.uint8)
    scales = torch.rand(n, k // group) * 0.01 + 1e-3
    mins = -torch.rand(n, k // group) * 0.08
    x = torch.randn(rows, k)
    packed = pack_int4(values)
    out = quant_matmul_int4(x, packed, scales, mins)
    weight = (values.double().reshape(n, -1, group) * scales.double()[..., None]
              + mins.double()[..., None]).reshape(n, k)
    assert_close_to(out, expected(x, weight), x)


def test_bfloat16_activations_come_back_bfloat16():
    torch.manual_seed(0)
    weight = torch.randn(40, 64)
    x = torch.randn(6, 64).bfloat16()
    q, scales = quantize_int8(weight, 64)
    out = quant_matmul_int8(x, q, scales)
    assert out.dtype == torch.bfloat16
    want = expected(x.float(), dequantize_int8(q, scales))
    torch.testing.assert_close(out.double(), want, rtol=2e-2, atol=2e-2)


def test_int4_packing_is_ggufs_block_layout():
    values = torch.arange(32, dtype=torch.uint8).remainder(16).reshape(1, 32)
    packed = pack_int4(values)
    # byte i: value i in the low nibble, value i + 16 in the high one
    assert packed.tolist() == [[i | (i << 4) for i in range(16)]]
    random = torch.randint(0, 16, (5, 128), dtype=torch.uint8)
    assert torch.equal(unpack_int4(pack_int4(random)), random)


@pytest.mark.parametrize("group", [32, 64, 128])
def test_quantize_int4_error_within_half_a_step(group):
    torch.manual_seed(group)
    weight = torch.randn(20, 256)
    packed, scales, mins = quantize_int4(weight, group)
    error = (dequantize_int4(packed, scales, mins) - weight).abs().reshape(20, -1, group)
    assert (error <= scales[..., None] / 2 + 1e-6).all()
    # each group's extremes are exact (min is the least value, the top step the largest)
    assert torch.allclose(dequantize_int4(packed, scales, mins).reshape(20, -1, group)
                          .amin(dim=2), weight.reshape(20, -1, group).amin(dim=2), atol=1e-6)


@pytest.mark.parametrize("group", [32, 256])
def test_quantize_int8_error_within_half_a_step(group):
    torch.manual_seed(group)
    weight = torch.randn(20, 256)
    q, scales = quantize_int8(weight, group)
    assert q.abs().reshape(20, -1, group).amax(dim=2).eq(127).all()
    error = (dequantize_int8(q, scales) - weight).abs().reshape(20, -1, group)
    assert (error <= scales[..., None] / 2 + 1e-6).all()


def test_shape_errors_name_the_problem():
    q = torch.zeros(4, 64, dtype=torch.int8)
    with pytest.raises(RuntimeError, match="does not divide"):
        torch.ops.folio.quant_matmul_int8(torch.empty(1, 4), torch.zeros(1, 64), q,
                                          torch.ones(4 * 3), 24 + 1)
    with pytest.raises(RuntimeError, match="multiple of 32"):
        torch.ops.folio.quant_matmul_int4(torch.empty(1, 4), torch.zeros(1, 64),
                                          torch.zeros(4, 32, dtype=torch.uint8),
                                          torch.ones(4, 4), torch.ones(4, 4), 16)


@pytest.mark.parametrize("rows", [9, 64, 130])
def test_register_kernel_alone_at_large_batches(rows):
    """The faces hand batches above small_batch() to a GEMM on dequantized tiles; the
    register kernel itself must hold at any batch."""
    torch.manual_seed(rows)
    n, k = 45, 128
    values = torch.randint(0, 16, (n, k), dtype=torch.uint8)
    scales, mins = torch.rand(n, 4) * 0.01, -torch.rand(n, 4) * 0.05
    x = torch.randn(rows, k)
    out = torch.empty(rows, n)
    torch.ops.folio.quant_matmul_int4(out, x, pack_int4(values), scales, mins, 32)
    assert_close_to(out, expected(x, dequantize_int4(pack_int4(values), scales, mins)), x)
    q = torch.randint(-127, 128, (n, k), dtype=torch.int8)
    torch.ops.folio.quant_matmul_int8(out, x, q, scales, 32)
    assert_close_to(out, expected(x, dequantize_int8(q, scales)), x)


def test_tiled_gemm_path_covers_every_row():
    # kernels/cpu/weight_only_linear.cpp dequantizes tiles of 2M values: at K = 1024 that is
    # 2048 rows, so 4103 rows of W make two whole tiles and a partial one.
    torch.manual_seed(1)
    n, k = 2 * 2048 + 7, 1024
    q, scales = quantize_int8(torch.randn(n, k), 32)
    x = torch.randn(20, k)
    assert_close_to(quant_matmul_int8(x, q, scales), expected(x, dequantize_int8(q, scales)), x)
    packed, s4, m4 = quantize_int4(torch.randn(n, k), 32)
    assert_close_to(quant_matmul_int4(x, packed, s4, m4),
                    expected(x, dequantize_int4(packed, s4, m4)), x)
