"""The two CPU paths of LoRA (docs/lora.md): the C++ segmented operator (chosen when the CPU
operators are built: adapters in host slots, executor/lora/cpu_pools.py) and the torch
matmuls per adapter (otherwise). Both give transformers + PEFT's greedy tokens in float32
with every adapter and the base model mixed in one generate, with fewer slots than adapters
so a slot is reused."""

from __future__ import annotations

import pytest

from folio import LLM
from folio.executor.lora.adapter import LoraWeights
from folio.executor.lora.registry import LoraRegistry
from folio.executor.models.architectures import ARCHITECTURES
from folio.kernels import cpu_attention
from tests.conftest import TEST_DEVICE
from tests.lora_adapters import ADAPTERS, greedy_per_adapter

pytestmark = [pytest.mark.parity,
              pytest.mark.skipif(TEST_DEVICE != "cpu", reason="the CPU executor's paths")]


def _llm(long_llama_dir, lora_adapters) -> LLM:
    return LLM(str(long_llama_dir), dtype="float32", device="cpu", enable_lora=True,
               max_model_len=1024, max_loras=2,
               lora_modules=[f"{n}={p}" for n, p in lora_adapters.items()])


def _mixed(llm: LLM) -> dict:
    return greedy_per_adapter(llm, [*ADAPTERS, None])


def test_the_cpp_operator_runs_mixed_steps(long_llama_dir, lora_adapters, lora_expected):
    status = cpu_attention.load()
    assert status.ok, f"scripts/setup.sh builds the CPU operators: {status.detail}"
    llm = _llm(long_llama_dir, lora_adapters)
    registry = llm.engine.executor.lora
    assert registry.cpu_pools is not None   # the C++ operator's path was chosen
    assert _mixed(llm) == {name: lora_expected[name] for name in [*ADAPTERS, None]}
    # The adapters sat in the operator's slots (two, reused), not as tensor pairs.
    assert sorted(registry.resident.values()) == [0, 1]
    pool = registry.cpu_pools.modules["layers.0.self_attn.qkv_proj"]
    assert pool.a.shape[:2] == (2, 3 * llm.engine.executor.config.max_lora_rank)
    assert int(pool.spans[:, :, 1].max()) > 0   # the slots' spans were written


def test_the_torch_path_without_the_operator(long_llama_dir, lora_adapters, lora_expected):
    llm = _llm(long_llama_dir, lora_adapters)
    executor = llm.engine.executor
    config = executor.config
    # The registry the executor makes when the C++ operators are not built.
    registry = LoraRegistry(executor.model, executor.model_config,
                            ARCHITECTURES[executor.model_config.architecture].weights,
                            executor.device, executor.dtype, config.max_loras,
                            config.max_lora_rank, config.lora_capacity, native=False)
    for name, path in lora_adapters.items():
        registry.load(name, path)
    executor.lora = registry
    assert _mixed(llm) == {name: lora_expected[name] for name in [*ADAPTERS, None]}
    assert registry.cpu_pools is None
    assert all(isinstance(w, LoraWeights) for w in registry.resident.values())
