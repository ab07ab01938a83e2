"""The AVX-512 VNNI kernel (kernels/cpu/vnni_gemm.cpp) through the layer that repacks for it
(WeightOnlyLinear): against float64 sums of the same rounded activations and the dequantized
weights, over shapes, odd sizes, batch sizes and every weight format the files bring (int8
per channel, Q8_0's groups of 32, int4 with a scale and a min per 32); a row's result does
not depend on its batch; the portable kernels give the same tokens."""

from __future__ import annotations

import pytest
import torch

from folio.executor.quantization import weight_only_linear
from folio.executor.quantization.weight_only_linear import (QuantizedWeight, WeightOnlyLinear,
                                                            quantize_weight)
from folio.kernels import cpu_attention, cpu_quant
from folio.kernels.vnni_layout import vnni_available

pytestmark = [pytest.mark.usefixtures("cpu_ops_built"),
              pytest.mark.skipif(not (cpu_attention.load().ok and vnni_available()),
                                 reason="needs the CPU operators built for a CPU with AVX-512 "
                                        "VNNI (elsewhere the AVX2 kernels run: test_quant_dot)")]


def exact(x: torch.Tensor, weight: QuantizedWeight) -> torch.Tensor:
    """The kernel's sum in float64: per block of 32, scale_x * (q_x . w)."""
    q, scales = cpu_quant.quantize_activations(x)
    rounded = (q.double().reshape(x.shape[0], -1, 32) * scales.double()[..., None])
    return rounded.reshape(x.shape) @ weight.dequantize().double().T


def weights(kind: str, n: int, k: int) -> QuantizedWeight:
    w = torch.randn(n, k) * 0.05
    if kind == "int8 per channel":
        return QuantizedWeight(8, *cpu_quant.quantize_int8(w, k), None)
    if kind == "int8 groups of 32":       # GGUF Q8_0
        return QuantizedWeight(8, *cpu_quant.quantize_int8(w, 32), None)
    if kind == "int8 groups of 64":
        return QuantizedWeight(8, *cpu_quant.quantize_int8(w, 64), None)
    return quantize_weight(w, 4)          # Q4_0 / Q4_1 / Q4_K: a scale and a min per 32


KINDS = ("int8 per channel", "int8 groups of 32", "int8 groups of 64", "int4")
# Every kind at every shape whose K holds its groups whole.
CASES = [(kind, n, k) for kind in KINDS for n, k in ((1, 32), (17, 64), (40, 576), (33, 1536))
         if not (kind == "int8 groups of 64" and k % 64)]


@pytest.mark.parametrize("kind, n, k", CASES)
def test_matches_float64_sums_of_the_rounded_activations(kind, n, k):
    torch.manual_seed(n * k)
    weight = weights(kind, n, k)
    layer = WeightOnlyLinear(weight, None, True, True)
    assert layer.vnni
    for rows in (1, 3, 4, 7, 64):
        x = torch.randn(rows, k)
        want = exact(x, weight)
        error = (layer(x).double() - want).abs().max() / want.abs().max()
        assert error < 1e-5, (rows, error.item())


@pytest.mark.parametrize("kind", KINDS)
def test_a_row_answers_the_same_in_any_batch(kind):
    torch.manual_seed(7)
    layer = WeightOnlyLinear(weights(kind, 50, 128), None, True, True)
    rows = torch.randn(64, 128) * torch.logspace(-2, 2, 64)[:, None]   # rows unlike each other
    alone = layer(rows[5:6])
    for batch in (2, 8, 9, 31, 64):
        mixed = torch.cat((rows[:batch - 1], rows[5:6])) if batch > 1 else rows[5:6]
        assert torch.equal(layer(mixed)[-1:], alone), batch


def test_bias_and_bfloat16_inputs():
    torch.manual_seed(8)
    weight, bias = weights("int8 groups of 32", 20, 64), torch.randn(20)
    layer = WeightOnlyLinear(weight, bias, True, True)
    x = torch.randn(3, 64)
    torch.testing.assert_close(layer(x).double(), exact(x, weight) + bias.double(),
                               rtol=1e-5, atol=1e-5)
    assert layer(x.bfloat16()).dtype == torch.bfloat16


def test_takes_minus_128_which_the_avx2_kernel_cannot():
    q = torch.randint(-127, 128, (8, 64), dtype=torch.int8)
    q[3, 5] = -128
    weight = QuantizedWeight(8, q, torch.rand(8, 2) * 0.01, None)
    layer = WeightOnlyLinear(weight, None, True, True)
    assert layer.vnni and layer.int8_activations
    x = torch.randn(2, 64)
    torch.testing.assert_close(layer(x).double(), exact(x, weight), rtol=1e-5, atol=1e-6)


def test_float_activations_asked_keep_the_float_kernels():
    layer = WeightOnlyLinear(weights("int8 per channel", 8, 64), None, True, False)
    assert not layer.vnni and "VNNI" not in repr(layer)


def test_portable_kernels_give_the_same_tokens(tmp_path, monkeypatch):
    from folio import LLM, SamplingParams
    from folio.tiny_models import make_random_checkpoint

    make_random_checkpoint(tmp_path, arch="llama", vocab_size=256, hidden_size=64,
                           num_layers=2, num_heads=4, num_kv_heads=2, intermediate_size=128)
    prompts = [[1, 5, 9, 13, 17], [2, 4, 8, 16, 32, 64, 100]]
    params = SamplingParams(temperature=0, max_tokens=12, ignore_eos=True)

    def tokens(vnni: bool) -> list[list[int]]:
        monkeypatch.setattr(weight_only_linear, "vnni_available", lambda: vnni)
        llm = LLM(str(tmp_path), skip_tokenizer_init=True, device="cpu", dtype="float32",
                  quantization="int8", num_kv_blocks=64)
        try:
            layers = [m for m in llm.engine.executor.model.modules()
                      if isinstance(m, WeightOnlyLinear)]
            assert layers and all(layer.vnni == vnni for layer in layers)
            return [out.outputs[0].token_ids for out in llm.generate(prompts, params)]
        finally:
            llm.close()

    assert tokens(True) == tokens(False)
