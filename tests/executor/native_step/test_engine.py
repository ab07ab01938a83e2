"""The engine's side of the native decode step: decode_step="auto" runs it where the model
allows (greedy tokens equal to decode_step="python"'s), the start-up log says which, the
families it does not cover keep the Python layers with the feature named, and a bad
setting is refused by name."""

from __future__ import annotations

from pathlib import Path

import pytest
from torch import nn

from folio import LLM, SamplingParams
from folio.executor.native_step.layers import unsupported_module
from folio.tiny_models import make_random_checkpoint
from tests.executor.native_step.harness import needs_cpu_operators
from tests.executor.native_step.harness import engine_and_step_lines as _llm
from tests.executor.native_step.spy import CountingStep
from tests.hf_oracle import random_prompts

pytestmark = needs_cpu_operators


def _checkpoint(tmp_path_factory, name: str, **checkpoint):
    path = tmp_path_factory.mktemp(name)
    make_random_checkpoint(path, max_position_embeddings=256, **checkpoint)
    return str(path)


@pytest.fixture(scope="module")
def llama(tmp_path_factory):
    return _checkpoint(tmp_path_factory, "llama", arch="llama")


def _greedy(llm: LLM, prompts, max_tokens) -> list[list[int]]:
    params = [SamplingParams(temperature=0, max_tokens=n, ignore_eos=True) for n in max_tokens]
    return [r.outputs[0].token_ids for r in llm.generate(prompts, params)]


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_auto_runs_the_native_step_and_answers_as_the_python_layers(llama, dtype, caplog):
    prompts, _ = random_prompts(6, 2, 40, vocab=1024, seed=3)
    max_tokens = [12, 5, 20, 1, 9, 16]
    python, lines = _llm(llama, caplog, dtype=dtype, decode_step="python")
    assert lines == ["decode step: Python layers (decode_step='python')"]
    assert python.engine.executor.model.native_step is None
    expected = _greedy(python, prompts, max_tokens)
    del python
    native, lines = _llm(llama, caplog, dtype=dtype)
    assert lines == ["decode step: native, one C++ call for the layers of steps of up to 16 "
                     "tokens"]
    model = native.engine.executor.model
    model.native_step = spy = CountingStep(model.native_step)
    assert _greedy(native, prompts, max_tokens) == expected
    assert spy.calls >= max(max_tokens) - 1   # every decode step after the prompts


@pytest.mark.parametrize("name,checkpoint,reason", [
    ("qwen3_moe", dict(arch="qwen3_moe", num_experts=4, num_experts_per_tok=2,
                       moe_intermediate_size=32), "MoE layers"),
    ("gemma2", dict(arch="gemma2"), "Gemma norms"),
])
def test_families_it_does_not_cover_keep_the_python_layers_and_say_why(
        tmp_path_factory, caplog, name, checkpoint, reason):
    llm, lines = _llm(_checkpoint(tmp_path_factory, name, **checkpoint), caplog,
                      dtype="float32")
    assert lines == [f"decode step: Python layers ({reason})"]
    assert llm.engine.executor.model.native_step is None
    assert len(_greedy(llm, [[5, 6, 7]], [4])[0]) == 4


def test_with_lora_it_runs_the_steps_without_adapter_rows(llama, caplog, tmp_path):
    """An engine with adapters on: steps whose rows are all the base model's run natively
    (greedy tokens equal to decode_step="python"'s); a step with an adapter row runs the
    Python layers, which add the adapter's terms (tokens equal to that adapter's alone)."""
    from tests.lora_adapters import make_adapter

    adapter = make_adapter(Path(llama), tmp_path / "a", seed=1, rank=4)
    prompts, _ = random_prompts(3, 2, 30, vocab=1024, seed=5)
    max_tokens = [9, 14, 6]
    engine = dict(dtype="float32", enable_lora=True, lora_modules=[f"a={adapter}"],
                  max_lora_rank=4)
    python, _ = _llm(llama, caplog, decode_step="python", **engine)
    expected_base = _greedy(python, prompts, max_tokens)
    params = [SamplingParams(temperature=0, max_tokens=n, ignore_eos=True) for n in max_tokens]
    expected_lora = [r.outputs[0].token_ids
                     for r in python.generate(prompts, params, lora=["a"] * 3)]
    del python
    assert expected_lora != expected_base   # the adapter changes the answers
    native, lines = _llm(llama, caplog, **engine)
    assert lines == ["decode step: native, one C++ call for the layers of steps of up to 16 "
                     "tokens without adapter rows"]
    model = native.engine.executor.model
    model.native_step = spy = CountingStep(model.native_step)
    assert _greedy(native, prompts, max_tokens) == expected_base
    assert spy.calls >= max(max_tokens) - 1
    spy.calls = 0
    assert [r.outputs[0].token_ids
            for r in native.generate(prompts, params, lora=["a"] * 3)] == expected_lora
    assert spy.calls == 0   # every step had adapter rows


def test_a_wrapped_or_hooked_layer_is_not_covered(llama, caplog):
    llm, lines = _llm(llama, caplog, dtype="float32", enable_lora=True, decode_step="python")
    model = llm.engine.executor.model
    assert unsupported_module(model) == "a replaced forward (LoRA)"
    assert unsupported_module(model, llm.engine.executor.lora.step) is None
    for module in model.modules():
        module.__dict__.pop("forward", None)
    assert unsupported_module(model) is None
    handle = model.layers[1].mlp.register_forward_hook(lambda *args: None)
    assert unsupported_module(model) == "forward hooks on a layer"
    handle.remove()
    model.layers[0].self_attn.o_proj = nn.Identity()
    assert unsupported_module(model) == "a Identity linear layer"


def test_a_bad_setting_is_refused_by_name(llama):
    with pytest.raises(ValueError, match="decode_step must be one of auto, python"):
        LLM(llama, skip_tokenizer_init=True, device="cpu", decode_step="native")
