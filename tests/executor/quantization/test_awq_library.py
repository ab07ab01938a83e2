"""An AWQ checkpoint made by AutoAWQ itself (awq_checkpoints.py) loads in Folio kept as int4:
every kept layer dequantizes to exactly AutoAWQ's own dequantize_gemm of the file (in float32
from the same scales widened; rounded to float16 as the library gives it from the file as
written), and Folio's prompt logprobs and greedy tokens are those of transformers running the
library's float32 dequantized model."""

from __future__ import annotations

import shutil

import pytest
import torch

from folio.shared.sampling_params import SamplingParams
from tests.conftest import TOKENIZER_FILES
from tests.executor.quantization.awq_checkpoints import (SHAPE, library_dequantized,
                                                         make_checkpoint, write_dequantized)

PROMPTS = [[5, 6, 7, 8, 9, 10, 11, 12], [300, 12, 999, 4, 77, 1]]
MAX_TOKENS = 4
FUSED = {"self_attn.qkv_proj": ("self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj"),
         "self_attn.o_proj": ("self_attn.o_proj",),
         "mlp.gate_up_proj": ("mlp.gate_proj", "mlp.up_proj"),
         "mlp.down_proj": ("mlp.down_proj",)}


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


@pytest.fixture(scope="module")
def cpu_ops_built():
    from folio.kernels import cpu_attention

    if not cpu_attention.load().ok:
        cpu_attention.build()


@pytest.mark.usefixtures("cpu_ops_built")
def test_autoawq_checkpoint_serves_the_library_dequantization(awq_dir, tmp_path):
    from transformers import AutoModelForCausalLM

    from folio import LLM
    from folio.executor.quantization.weight_only_linear import WeightOnlyLinear

    llm = LLM(str(awq_dir), dtype="float32", device="cpu", num_kv_blocks=64,
              quantized_activations="float")
    kept = {n: m for n, m in llm.engine.executor.model.named_modules()
            if isinstance(m, WeightOnlyLinear)}
    assert "lm_head" not in kept and len(kept) == 8
    exact = library_dequantized(awq_dir, torch.float32)
    as_written = library_dequantized(awq_dir)
    for layer in range(2):
        for fused, parts in FUSED.items():
            module = kept[f"layers.{layer}.{fused}"]
            assert module.bits == 4
            got = module.quantized_weight().dequantize()
            for library, rounded in ((exact, got), (as_written, got.half())):
                expected = torch.cat([library[f"model.layers.{layer}.{part}.weight"]
                                      for part in parts])
                assert torch.equal(rounded, expected), fused

    reference = AutoModelForCausalLM.from_pretrained(
        str(write_dequantized(awq_dir, tmp_path / "dequantized")), dtype=torch.float32).eval()
    outs = llm.generate(PROMPTS, SamplingParams(max_tokens=MAX_TOKENS, temperature=0,
                                                prompt_logprobs=5))
    with torch.inference_mode():
        for prompt, out in zip(PROMPTS, outs):
            ids = torch.tensor([prompt])
            want = torch.log_softmax(reference(ids).logits[0, :-1].float(), dim=-1)
            positions = out.prompt_logprobs[1:]
            assert len(positions) == want.shape[0]
            for position, row in zip(positions, want):
                for token, entry in position.items():
                    assert abs(entry.logprob - row[token].item()) < 1e-3, token
            greedy = reference.generate(ids, attention_mask=torch.ones_like(ids),
                                        max_new_tokens=MAX_TOKENS, do_sample=False)
            assert out.outputs[0].token_ids == greedy[0, len(prompt):].tolist()
