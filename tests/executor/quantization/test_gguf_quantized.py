"""A GGUF file's Q8_0/Q4_0/Q4_1/Q4_K linear weights kept quantized (executor/quantization/gguf/quantized.py):
the re-expression of each block type is exact, and a model served kept-quantized gives the
logits of the same file dequantized in float32."""

from __future__ import annotations

import numpy as np
import pytest

from folio.executor.quantization.gguf.quantized import KEPT_TYPES, quantized_weight
from tests.executor.quantization.gguf_files import random_k_quant
from tests.executor.quantization.gguf_checks import kept_and_dequantized_agree, prompt_logprobs
from tests.executor.quantization.test_gguf import gguf_dir, k_quant_dir  # noqa: F401 (fixtures)

pytestmark = pytest.mark.usefixtures("cpu_ops_built")   # conftest.py
PROMPTS = [[5, 6, 7, 8, 9, 10, 11, 12], [300, 12, 999, 4, 77, 1]]


@pytest.mark.parametrize("type_name", KEPT_TYPES)
def test_blocks_reexpressed_exactly(type_name):
    import gguf
    from gguf.quants import dequantize, quantize

    qtype = gguf.GGMLQuantizationType[type_name]
    rng = np.random.default_rng(0)
    if type_name == "Q4_K":
        data = random_k_quant(6, 512, "Q4_K", seed=3)
    else:
        data = quantize(rng.standard_normal((6, 128)).astype(np.float32), qtype)
    weight = quantized_weight(data, type_name)
    assert weight.bits == (8 if type_name == "Q8_0" else 4) and weight.group == 32
    assert np.array_equal(weight.dequantize().numpy(), dequantize(data, qtype))


@pytest.mark.parametrize("quant", ["Q8_0", "Q4_0", "Q4_1", "Q4_K"])
def test_kept_quantized_gives_the_dequantized_logits(quant, gguf_dir, k_quant_dir,  # noqa: F811
                                                     monkeypatch):
    path = (k_quant_dir if quant == "Q4_K" else gguf_dir) / f"tiny-{quant}.gguf"
    kept = kept_and_dequantized_agree(path, PROMPTS, monkeypatch)
    # every attention and MLP linear is kept (fused q/k/v and gate/up from their parts)
    assert any(name.endswith("qkv_proj") for name in kept)
    assert any(name.endswith("gate_up_proj") for name in kept)
    assert any(name.endswith("down_proj") for name in kept)


def test_other_types_stay_float(gguf_dir, monkeypatch):  # noqa: F811
    _, kept = prompt_logprobs(gguf_dir / "tiny-Q5_0.gguf", PROMPTS, monkeypatch, keep=True)
    assert kept == []
