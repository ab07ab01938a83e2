"""The int8-activation matmuls (kernels/cpu/quant_dot.cpp) against float64 sums of the same
rounded activations (cpu_quant.quantize_activations) and the dequantized weights: the integer
dot products are exact, so only float32 accumulation separates them; plus the rounding's own
error against float activations, and how the layers choose the kernel."""

from __future__ import annotations

import pytest
import torch

from folio.kernels import cpu_quant
from folio.kernels.cpu_quant import (dequantize_int4, dequantize_int8, pack_int4,
                                     quant_matmul_int4, quant_matmul_int8,
                                     quantize_activations, quantize_int4, quantize_int8)

pytestmark = pytest.mark.usefixtures("cpu_ops_built")


def rounded(x: torch.Tensor) -> torch.Tensor:
    q, scales = quantize_activations(x)
    m, k = x.shape
    return (q.double().reshape(m, -1, 32) * scales.double()[..., None]).reshape(m, k)


def assert_exact_but_rounding(out: torch.Tensor, want: torch.Tensor) -> None:
    scale = want.abs().max().item()
    assert ((out.double() - want).abs() <= 1e-5 * scale + 1e-6).all()


@pytest.mark.parametrize("rows", [1, 2, 3, 4, 5, 8])
@pytest.mark.parametrize("n,k,group", [(37, 64, 32), (50, 96, 96), (130, 256, 128), (3, 32, 32)])
def test_int8_weights(rows, n, k, group):
    torch.manual_seed(rows * 100 + n)
    q = torch.randint(-127, 128, (n, k), dtype=torch.int8)
    scales = torch.rand(n, k // group) * 0.01 + 1e-3
    x = torch.randn(rows, k) * 3
    out = torch.empty(rows, n)
    torch.ops.folio.quant_dot_int8(out, x, q, scales, group)
    assert_exact_but_rounding(out, rounded(x) @ dequantize_int8(q, scales).double().T)


@pytest.mark.parametrize("rows", [1, 3, 4, 7])
@pytest.mark.parametrize("n,k,group", [(37, 64, 32), (9, 256, 128), (130, 576, 64)])
def test_int4_weights(rows, n, k, group):
    torch.manual_seed(rows * 100 + n)
    packed = pack_int4(torch.randint(0, 16, (n, k), dtype=torch.uint8))
    scales = torch.rand(n, k // group) * 0.01 + 1e-3
    mins = -torch.rand(n, k // group) * 0.08
    x = torch.randn(rows, k)
    out = torch.empty(rows, n)
    torch.ops.folio.quant_dot_int4(out, x, packed, scales, mins, group)
    assert_exact_but_rounding(out, rounded(x) @ dequantize_int4(packed, scales, mins).double().T)


def test_blocks_of_zeros_and_extremes():
    q = torch.full((4, 64), 127, dtype=torch.int8)
    q[1] = -127
    scales = torch.ones(4, 1)
    x = torch.zeros(2, 64)
    x[1, 32:] = torch.linspace(-1000, 1000, 32)   # one block zero, one with both extremes
    out = torch.empty(2, 4)
    torch.ops.folio.quant_dot_int8(out, x, q, scales, 64)
    assert out[0].eq(0).all()
    assert_exact_but_rounding(out, rounded(x) @ dequantize_int8(q, scales).double().T)


def test_rounding_error_is_a_few_parts_in_a_thousand():
    torch.manual_seed(3)
    weight = torch.randn(256, 576) * 0.05
    x = torch.randn(4, 576)
    q, scales = quantize_int8(weight, 576)
    exact = x.double() @ dequantize_int8(q, scales).double().T
    error = (quant_matmul_int8(x, q, scales, int8_activations=True).double() - exact).abs()
    assert error.max() / exact.abs().max() < 1e-2
    assert error.mean() / exact.abs().mean() < 1e-2


def test_faces_take_the_dot_kernel_only_for_small_batches():
    torch.manual_seed(4)
    q, scales = quantize_int8(torch.randn(40, 64), 64)
    packed, s4, m4 = quantize_int4(torch.randn(40, 64), 32)
    rows = cpu_quant.small_batch()
    small, large = torch.randn(rows, 64), torch.randn(rows + 1, 64)
    assert_exact_but_rounding(quant_matmul_int8(small, q, scales, True),
                              rounded(small) @ dequantize_int8(q, scales).double().T)
    assert_exact_but_rounding(quant_matmul_int4(small, packed, s4, m4, True),
                              rounded(small) @ dequantize_int4(packed, s4, m4).double().T)
    float_sum = large.double() @ dequantize_int8(q, scales).double().T
    assert_exact_but_rounding(quant_matmul_int8(large, q, scales, True), float_sum)


def test_layer_keeps_float_activations_where_the_kernel_cannot_run(monkeypatch):
    from folio.executor.quantization import weight_only_linear
    from folio.executor.quantization.weight_only_linear import QuantizedWeight, WeightOnlyLinear

    # The AVX2 kernel's limit: the VNNI kernel (test_vnni_gemm.py) takes -128.
    monkeypatch.setattr(weight_only_linear, "vnni_available", lambda: False)

    q = torch.randint(-127, 128, (8, 64), dtype=torch.int8)
    scales = torch.rand(8, 2) * 0.01
    assert WeightOnlyLinear(QuantizedWeight(8, q, scales, None), None, True, True).int8_activations
    q[3, 5] = -128    # the sign trick cannot negate it
    held = WeightOnlyLinear(QuantizedWeight(8, q, scales, None), None, True, True)
    assert not held.int8_activations
    x = torch.randn(2, 64)
    assert_exact_but_rounding(held(x), x.double() @ dequantize_int8(q, scales).double().T)
    assert "float activations" in repr(held)


def test_shape_errors_name_the_problem():
    with pytest.raises(RuntimeError, match="multiple of 32"):
        torch.ops.folio.quant_dot_int8(torch.empty(1, 4), torch.zeros(1, 48),
                                       torch.zeros(4, 48, dtype=torch.int8), torch.ones(4, 1), 48)
