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

from folio.shared.sampling_params import SamplingParams
from tests.executor.quantization.compressed_tensors_checkpoints import (SCHEMES,
                                                                        library_decompressed,
                                                                        make_checkpoint,
                                                                        widen_scales)

PROMPTS = [[5, 6, 7, 8, 9, 10, 11, 12], [300, 12, 999, 4, 77, 1]]
MAX_TOKENS = 4
# Folio's fused layers and the checkpoint's layers they hold, in order
FUSED = {"self_attn.qkv_proj": ("self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj"),
         "self_attn.o_proj": ("self_attn.o_proj",),
         "mlp.gate_up_proj": ("mlp.gate_proj", "mlp.up_proj"),
         "mlp.down_proj": ("mlp.down_proj",)}
SERVED = [name for name in SCHEMES if name != "w4a16_asym"]


@pytest.fixture(scope="module")
def cpu_ops_built():
    from folio.kernels import cpu_attention

    if not cpu_attention.load().ok:
        cpu_attention.build()


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


def _hf_reference(model) -> tuple[list[torch.Tensor], list[list[int]]]:
    """Per prompt: log-softmax over the vocabulary at each position after the first, and
    the greedy continuation."""
    logprobs, tokens = [], []
    with torch.inference_mode():
        for prompt in PROMPTS:
            ids = torch.tensor([prompt])
            logits = model(ids).logits[0, :-1].float()
            logprobs.append(torch.log_softmax(logits, dim=-1))
            out = model.generate(ids, attention_mask=torch.ones_like(ids),
                                 max_new_tokens=MAX_TOKENS, do_sample=False)
            tokens.append(out[0, len(prompt):].tolist())
    return logprobs, tokens


@pytest.mark.usefixtures("cpu_ops_built")
@pytest.mark.parametrize("name", SERVED)
def test_library_checkpoint_serves_the_library_decompression(name, made, tmp_path):
    from folio import LLM
    from folio.executor.quantization.weight_only_linear import WeightOnlyLinear

    path = made(name)
    fmt, weights, _ = SCHEMES[name]
    written = json.loads((path / "config.json").read_text())["quantization_config"]
    assert written["format"] == fmt and written["quant_method"] == "compressed-tensors"

    llm = LLM(str(path), dtype="float32", device="cpu", num_kv_blocks=64,
              quantized_activations="float")
    kept = {n: m for n, m in llm.engine.executor.model.named_modules()
            if isinstance(m, WeightOnlyLinear)}
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
                expected = torch.cat([params[f"model.layers.{layer}.{part}.weight"]
                                      for part in parts])
                assert expected.dtype == torch.float32
                assert torch.equal(rounded, expected), fused

    outs = llm.generate(PROMPTS, SamplingParams(max_tokens=MAX_TOKENS, temperature=0,
                                                prompt_logprobs=5))
    hf_logprobs, hf_tokens = _hf_reference(reference)
    assert [out.outputs[0].token_ids for out in outs] == hf_tokens
    for out, want in zip(outs, hf_logprobs):
        positions = out.prompt_logprobs[1:]
        assert len(positions) == want.shape[0]
        for position, row in zip(positions, want):
            for token, entry in position.items():
                assert abs(entry.logprob - row[token].item()) < 1e-3, (name, token)


def test_library_asymmetric_checkpoint_is_refused_by_name(made):
    """W4A16_ASYM (zero points in the file) is refused before any weight is read."""
    from folio.preflight import check_engine
    from folio.shared.config import EngineConfig, SettingError

    path = made("w4a16_asym")
    with pytest.raises(SettingError, match="asymmetric int4") as error:
        check_engine(EngineConfig(model=str(path), device="cpu", skip_tokenizer_init=True))
    assert error.value.setting == "model"
