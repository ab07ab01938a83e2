"""int8 / int4 weights (`quantization="int8"|"int4"`) on hybrid models: every linear layer
of the recurrent layers (Gated DeltaNet's projections, the short convolutions' in / out
projections), the attention layers, the MLPs and lm_head runs as a WeightOnlyLinear, and
the next tokens agree with the same model's float32 path as
tests/executor/quantization/test_weight_only_linear.py measures it (one greedy token after
each of 64 prompts)."""

from __future__ import annotations

import pytest
from torch import nn

from folio import LLM, SamplingParams
from folio.executor.linear import PackedLinear
from folio.executor.quantization.weight_only_linear import WeightOnlyLinear
from tests.executor.hybrid.checkpoints import make_hybrid_dir
from tests.hf_oracle import random_prompts

PROMPTS, _ = random_prompts(64, 3, 60, vocab=1024, seed=5)
# Measured on these tiny random checkpoints (their logits are full of near-ties), next
# tokens agreeing with float32 out of 64: int8 56 (Qwen3.5) and 59 (LFM2), int4 29 and 34;
# the full-attention llama and qwen2 of the same size agree on 63 and 62, 39 and 45.
AGREEING = {"int8": 0.8, "int4": 0.4}
RECURRENT_LINEARS = {"GatedDeltaNet": ("in_proj_qkv", "in_proj_z", "in_proj_b", "in_proj_a",
                                       "out_proj"),
                     "ShortConv": ("in_proj", "out_proj")}


@pytest.fixture(scope="module", params=["qwen3_5", "lfm2"])
def hybrid(request, tmp_path_factory, tokenizer_dir):
    path = make_hybrid_dir(tmp_path_factory.mktemp(request.param), tokenizer_dir,
                           request.param)
    reference = LLM(str(path), dtype="float32", device="cpu", num_kv_blocks=256)
    return str(path), _next_tokens(reference, PROMPTS), _next_tokens(reference, PROMPTS[:4], 8)


def _next_tokens(llm, prompts, count=1):
    params = [SamplingParams(temperature=0.0, max_tokens=count)] * len(prompts)
    return [r.outputs[0].token_ids for r in llm.generate(prompts, params)]


@pytest.mark.parametrize("quantization", ["int8", "int4"])
def test_quantized_hybrid_predicts_its_float32_tokens(hybrid, quantization):
    model_dir, reference, reference_long = hybrid
    llm = LLM(model_dir, dtype="float32", device="cpu", num_kv_blocks=256,
              quantization=quantization)
    executor = llm.engine.executor
    assert executor.linear_backend == quantization
    model = executor.model
    layers = [m for m in model.modules() if isinstance(m, WeightOnlyLinear)]
    assert not [m for m in model.modules() if isinstance(m, (nn.Linear, PackedLinear))]
    recurrent = [layer.mixer for layer in model.layers if not layer.is_attention]
    assert recurrent and all(isinstance(getattr(mixer, name, None), WeightOnlyLinear)
                             for mixer in recurrent for name in RECURRENT_LINEARS[type(
                                 mixer).__name__])
    assert {m.bits for m in layers if m is not model.lm_head} == {int(quantization[3:])}
    assert model.lm_head.bits == 8
    tokens = _next_tokens(llm, PROMPTS)
    agreed = sum(q == r for q, r in zip(tokens, reference))
    assert agreed >= AGREEING[quantization] * len(PROMPTS), (agreed, tokens, reference)
    longer = _next_tokens(llm, PROMPTS[:4], 8)
    assert all(len(t) == 8 for t in longer)   # it produces text
    if quantization == "int8":
        assert sum(a == b for a, b in zip(longer, reference_long)) >= 1
    stats = llm.stats()
    assert stats["state_slots_used"] == 0 and stats["kv_blocks_free"] == stats["kv_blocks_total"]


def test_int4_refuses_value_heads_its_groups_cannot_take(tmp_path, tokenizer_dir):
    """Gated DeltaNet's out_proj reads num_v_heads * v_head_dim values: 6 heads of 8 are 48,
    not a multiple of int4's 32-value groups, refused by name before any weight is read."""
    import json
    import shutil

    from folio.preflight import check_engine
    from folio.shared.config import EngineConfig, SettingError

    (tmp_path / "made").mkdir()
    model_dir = make_hybrid_dir(tmp_path / "made", tokenizer_dir, "qwen3_5")
    odd = tmp_path / "odd"
    shutil.copytree(model_dir, odd)
    config = json.loads((odd / "config.json").read_text())
    config["linear_num_value_heads"] = 6
    (odd / "config.json").write_text(json.dumps(config))
    check_engine(EngineConfig(model=str(odd), device="cpu", quantization="int8"))
    with pytest.raises(SettingError) as info:
        check_engine(EngineConfig(model=str(odd), device="cpu", quantization="int4"))
    assert "quantization" in str(info.value) and "Gated DeltaNet" in str(info.value)
    assert "48" in str(info.value)
