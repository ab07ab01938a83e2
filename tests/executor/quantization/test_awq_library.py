"""An AWQ checkpoint made by AutoAWQ itself (awq_checkpoints.py) loads in Folio kept as int4:
every kept layer dequantizes to exactly AutoAWQ's own dequantize_gemm of the file (in float32
from the same scales widened; rounded to float16 as the library gives it from the file as
written), and Folio's prompt logprobs and greedy tokens are those of transformers running the
library's float32 dequantized model."""

from __future__ import annotations

import shutil

import pytest
import torch

from tests.conftest import TOKENIZER_FILES
from tests.executor.quantization.awq_checkpoints import (SHAPE, library_dequantized,
                                                         make_checkpoint, write_dequantized)
from tests.executor.quantization.library_checks import (FUSED, assert_answers_like,
                                                        kept_layers, library_weight)



@pytest.fixture(scope="module")
def awq_dir(tokenizer_dir, tmp_path_factory):
    from folio.tiny_models import make_random_checkpoint

    root = tmp_path_factory.mktemp("autoawq")
    source = root / "float"
    source.mkdir()
    for file in TOKENIZER_FILES:
        if (tokenizer_dir / file).exists():
            shutil.copy(tokenizer_dir / file, source / file)
    make_random_checkpoint(source, vocab_size=1024, **SHAPE)
    return make_checkpoint(source, root / "awq")


@pytest.mark.usefixtures("cpu_ops_built")
def test_autoawq_checkpoint_serves_the_library_dequantization(awq_dir, tmp_path):
    from transformers import AutoModelForCausalLM

    from folio import LLM

    llm = LLM(str(awq_dir), dtype="float32", device="cpu", num_kv_blocks=64,
              quantized_activations="float")
    kept = kept_layers(llm)
    assert "lm_head" not in kept and len(kept) == 8
    exact = library_dequantized(awq_dir, torch.float32)
    as_written = library_dequantized(awq_dir)
    for layer in range(2):
        for fused, parts in FUSED.items():
            module = kept[f"layers.{layer}.{fused}"]
            assert module.bits == 4
            got = module.quantized_weight().dequantize()
            for library, rounded in ((exact, got), (as_written, got.half())):
                assert torch.equal(rounded, library_weight(library, layer, parts)), fused

    reference = AutoModelForCausalLM.from_pretrained(
        str(write_dequantized(awq_dir, tmp_path / "dequantized")), dtype=torch.float32).eval()
    assert_answers_like(llm, reference, "awq")
