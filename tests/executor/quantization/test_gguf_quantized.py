"""A GGUF file's Q8_0/Q4_0/Q4_1/Q4_K linear weights kept quantized (executor/quantization/gguf/quantized.py):
the re-expression of each block type is exact, and a model served kept-quantized gives the
logits of the same file dequantized in float32."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from folio.executor.quantization import weight_formats
from folio.executor.quantization.gguf.quantized import KEPT_TYPES, quantized_weight
from folio.executor.quantization.weight_only_linear import WeightOnlyLinear
from folio.shared.sampling_params import SamplingParams
from tests.executor.quantization.gguf_files import random_k_quant
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


def _prompt_logprobs(path: Path, monkeypatch, keep: bool) -> tuple[list, object]:
    from folio import LLM

    if not keep:
        monkeypatch.setattr(weight_formats, "keep_gguf_quantized", lambda *args: 0)
    # float activations: the file's blocks against their dequantized floats, exactly (the
    # default int8 activations of small batches round x too: tests/kernels/test_quant_dot.py)
    llm = LLM(str(path), dtype="float32", device="cpu", num_kv_blocks=64,
              quantized_activations="float")
    outs = llm.generate(PROMPTS, SamplingParams(max_tokens=1, temperature=0,
                                                prompt_logprobs=5))
    kept = [name for name, module in llm.engine.executor.model.named_modules()
            if isinstance(module, WeightOnlyLinear)]
    monkeypatch.undo()
    values = [[{token: entry.logprob for token, entry in position.items()}
               for position in out.prompt_logprobs[1:]] for out in outs]
    return values, kept


@pytest.mark.parametrize("quant", ["Q8_0", "Q4_0", "Q4_1", "Q4_K"])
def test_kept_quantized_gives_the_dequantized_logits(quant, gguf_dir, k_quant_dir,  # noqa: F811
                                                     monkeypatch):
    path = (k_quant_dir if quant == "Q4_K" else gguf_dir) / f"tiny-{quant}.gguf"
    kept_values, kept = _prompt_logprobs(path, monkeypatch, keep=True)
    float_values, none = _prompt_logprobs(path, monkeypatch, keep=False)
    assert none == []
    # every attention and MLP linear is kept (fused q/k/v and gate/up from their parts)
    assert any(name.endswith("qkv_proj") for name in kept)
    assert any(name.endswith("gate_up_proj") for name in kept)
    assert any(name.endswith("down_proj") for name in kept)
    for kept_position, float_position in zip(
            [p for prompt in kept_values for p in prompt],
            [p for prompt in float_values for p in prompt]):
        assert kept_position.keys() == float_position.keys()   # the same top tokens
        for token, logprob in float_position.items():
            assert abs(kept_position[token] - logprob) < 1e-3


def test_other_types_stay_float(gguf_dir, monkeypatch):  # noqa: F811
    _, kept = _prompt_logprobs(gguf_dir / "tiny-Q5_0.gguf", monkeypatch, keep=True)
    assert kept == []
