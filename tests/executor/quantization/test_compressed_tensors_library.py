"""compressed-tensors checkpoints made by the real library (compressed_tensors_checkpoints.py)
load in Folio kept quantized: every kept layer dequantizes to exactly the weight the library's
own decompression gives (in float32 from the same scales widened; rounded to bfloat16 as the
library gives it from the file as written), and Folio's prompt logprobs and greedy tokens are
those of transformers running the library's float32 decompressed model."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from tests.executor.quantization.compressed_tensors_checkpoints import (SCHEMES,
                                                                        library_decompressed,
                                                                        make_checkpoint,
                                                                        widen_scales)
from tests.executor.quantization.library_checks import (FUSED, assert_answers_like,
                                                        kept_layers, library_weight)

SERVED = [name for name in SCHEMES if name != "w4a16_asym"]


@pytest.fixture(scope="module")
def made(llama_dir, tmp_path_factory):
    """scheme name -> the checkpoint compressed-tensors wrote, made on first use."""
    root = tmp_path_factory.mktemp("compressed-tensors")
    cache: dict[str, Path] = {}

    def get(name: str) -> Path:
        if name not in cache:
            cache[name] = make_checkpoint(llama_dir, root / name, name)
        return cache[name]
    return get


@pytest.mark.usefixtures("cpu_ops_built")
@pytest.mark.parametrize("name", SERVED)
def test_library_checkpoint_serves_the_library_decompression(name, made, tmp_path):
    from folio import LLM

    path = made(name)
    fmt, weights, _ = SCHEMES[name]
    written = json.loads((path / "config.json").read_text())["quantization_config"]
    assert written["format"] == fmt and written["quant_method"] == "compressed-tensors"

    llm = LLM(str(path), dtype="float32", device="cpu", num_kv_blocks=64,
              quantized_activations="float")
    kept = kept_layers(llm)
    assert "lm_head" not in kept and len(kept) == 8       # ignored by the config: stays float
    reference = library_decompressed(widen_scales(path, tmp_path / "widened"))
    library = dict(reference.named_parameters())
    as_written = dict(library_decompressed(path).named_parameters())
    for layer in range(2):
        for fused, parts in FUSED.items():
            module = kept[f"layers.{layer}.{fused}"]
            assert module.bits == weights.num_bits
            got = module.quantized_weight().dequantize()
            for params, rounded in ((library, got), (as_written, got.bfloat16().float())):
                expected = library_weight(params, layer, parts)
                assert expected.dtype == torch.float32
                assert torch.equal(rounded, expected), fused

    assert_answers_like(llm, reference, name)


def test_library_asymmetric_checkpoint_is_refused_by_name(made):
    """W4A16_ASYM (zero points in the file) is refused before any weight is read."""
    from folio.preflight import check_engine
    from folio.shared.config import EngineConfig, SettingError

    path = made("w4a16_asym")
    with pytest.raises(SettingError, match="asymmetric int4") as error:
        check_engine(EngineConfig(model=str(path), device="cpu", skip_tokenizer_init=True))
    assert error.value.setting == "model"
