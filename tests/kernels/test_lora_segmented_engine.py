"""The engine's LoRA path on the segmented kernel (what CUDA runs: adapters in device slot
pools, two launches per projection), here under triton's interpreter: adapters and the base
model in one generate give transformers + PEFT's greedy tokens in float32, with fewer slots
than adapters so a slot is reused. (Mixed batches of many adapters against float64 are
tests/kernels/test_triton_lora.py's.)"""

from __future__ import annotations

import pytest

from folio import LLM
from folio.executor.lora.registry import LoraRegistry
from folio.executor.models.architectures import ARCHITECTURES
from tests.lora_adapters import MAX_TOKENS, PROMPTS, greedy_per_adapter

pytestmark = pytest.mark.parity


def _segmented(llm: LLM, adapters: dict, max_loras: int) -> LoraRegistry:
    """The executor's registry swapped for one on the segmented kernel (as CUDA makes it)."""
    executor = llm.engine.executor
    config = executor.config
    registry = LoraRegistry(executor.model, executor.model_config,
                            ARCHITECTURES[executor.model_config.architecture].weights,
                            executor.device, executor.dtype, max_loras,
                            config.max_lora_rank, config.lora_capacity, segmented=True)
    for name, path in adapters.items():
        registry.load(name, path)
    executor.lora = registry
    return registry


def test_adapters_on_the_segmented_kernel_match_peft(long_llama_dir, lora_adapters,
                                                           lora_expected, device):
    llm = LLM(str(long_llama_dir), dtype="float32", device=str(device), enable_lora=True,
              max_model_len=1024, max_loras=1,
              lora_modules=[f"{n}={p}" for n, p in lora_adapters.items()])
    registry = _segmented(llm, lora_adapters, max_loras=1)
    # Two adapters beside the base on the shortest prompt (the interpreter is slow): with
    # one slot, the second adapter waits, then takes the slot the first one left.
    names = ["all", "qv-down", None]
    got = greedy_per_adapter(llm, names, PROMPTS[2:], MAX_TOKENS[2:])
    assert got == {name: lora_expected[name][2:] for name in names}
    assert list(registry.resident.values()) == [0]   # one slot, reused
    stats = llm.stats()
    assert stats["kv_blocks_free"] == stats["kv_blocks_total"]
