"""--kv-cache-dtype through the engine: the pool's block count grows by the row-width
ratio, the cache is stored as asked, decode, swap preemption and prefix caching run on a
quantized cache and give every block back, and the settings the attention backend cannot
read are refused before anything starts."""

from __future__ import annotations

import random

import pytest
import torch

from folio import LLM, SamplingParams
from folio.preflight import check_engine
from folio.shared.config import EngineConfig, SettingError
from folio.shared.kv_cache_dtype import kv_row_bytes

GIB = 0.01
STORED = {"auto": torch.float32, "bfloat16": torch.bfloat16, "int8": torch.int8,
          "fp8_e4m3": torch.float8_e4m3fn, "fp8_e5m2": torch.float8_e5m2}


def _prompts(count: int = 10, seed: int = 5):
    rng = random.Random(seed)
    shared = [rng.randrange(1, 1024) for _ in range(70)]
    prompts = [shared[:rng.randint(20, 70)] + [rng.randrange(1, 1024)
                                               for _ in range(rng.randint(1, 60))]
               for _ in range(count)]
    return prompts, [SamplingParams(temperature=0, max_tokens=rng.randint(4, 30))
                     for _ in range(count)]


def _idle(stats) -> bool:
    return (stats["kv_blocks_free"] == stats["kv_blocks_total"]
            and stats["swap_blocks_free"] == stats["swap_blocks_total"]
            and stats["num_running"] == stats["num_waiting"] == stats["num_swapped"] == 0)


@pytest.mark.parametrize("kv_cache_dtype", list(STORED))
def test_pool_holds_more_blocks_by_the_row_width_ratio(llama_dir, kv_cache_dtype):
    llm = LLM(str(llama_dir), dtype="float32", cpu_kv_cache_gib=GIB,
              kv_cache_dtype=kv_cache_dtype)
    executor = llm.engine.executor
    config = executor.model_config
    row = kv_row_bytes(kv_cache_dtype, "float32", config.head_dim)
    block_bytes = 2 * config.num_layers * 16 * config.num_kv_heads * row
    assert executor.bytes_per_block == block_bytes
    assert llm.stats()["kv_blocks_total"] == int(GIB * 2**30 // block_bytes)
    key_cache = executor.kv_caches[0][0]
    assert key_cache.dtype == STORED[kv_cache_dtype]
    assert key_cache.element_size() * key_cache[0].numel() * 2 * config.num_layers \
        == block_bytes
    out = llm.generate([[5, 6, 7, 8, 9] * 7], SamplingParams(temperature=0, max_tokens=12))
    assert len(out[0].outputs[0].token_ids) == 12
    assert _idle(llm.stats())


def test_int8_cache_runs_swap_and_prefix_caching_without_leaking(llama_dir):
    prompts, params = _prompts()
    plain = LLM(str(llama_dir), dtype="float32", kv_cache_dtype="int8",
                enable_prefix_caching=False, num_kv_blocks=2048)
    expected = [r.outputs[0].token_ids for r in plain.generate(prompts, params)]

    swapping = LLM(str(llama_dir), dtype="float32", kv_cache_dtype="int8", num_kv_blocks=14,
                   preemption_mode="swap", num_swap_blocks=64, enable_prefix_caching=False,
                   max_num_batched_tokens=64)
    swapped = [r.outputs[0].token_ids for r in swapping.generate(prompts, params)]
    stats = swapping.stats()
    assert stats["preemptions_swap"] > 0 and _idle(stats)
    # Swap moves each block's rows and scales as they are: the same tokens.
    assert swapped == expected

    caching = LLM(str(llama_dir), dtype="float32", kv_cache_dtype="int8", num_kv_blocks=512,
                  block_size=8)
    first = [r.outputs[0].token_ids for r in caching.generate(prompts, params)]
    again = [r.outputs[0].token_ids for r in caching.generate(prompts, params)]
    stats = caching.stats()
    assert stats["prefix_cache_hits"] > 0.5 * sum(map(len, prompts))
    assert first == again == expected
    assert stats["kv_blocks_free"] == stats["kv_blocks_total"]


@pytest.mark.parametrize("backend", ["cpu", "torch"])
def test_int8_cache_attention_stays_close_to_the_float_cache(llama_dir, backend):
    """The last position's logits of a prompt, float32 cache vs int8 cache: the attention
    error the quantized rows add stays small (greedy agreement on a random tiny model is
    not guaranteed, so the logits are compared)."""
    prompt = [random.Random(1).randrange(1, 1024) for _ in range(90)]
    logprobs = {}
    for kv_cache_dtype in ("auto", "int8"):
        llm = LLM(str(llama_dir), dtype="float32", kv_cache_dtype=kv_cache_dtype,
                  attention_backend=backend, num_kv_blocks=64)
        out = llm.generate([prompt], SamplingParams(temperature=0, max_tokens=8, logprobs=5))
        logprobs[kv_cache_dtype] = out[0].outputs[0]
    first_float = logprobs["auto"].logprobs[0]
    first_int8 = logprobs["int8"].logprobs[0]
    shared = set(first_float) & set(first_int8)
    assert shared
    for token in shared:
        assert abs(first_float[token].logprob - first_int8[token].logprob) < 0.05


@pytest.mark.parametrize("engine, fragment", [
    (dict(device="cuda", kv_cache_dtype="bfloat16"), "Triton"),
    (dict(device="auto", attention_backend="triton", kv_cache_dtype="bfloat16"), "Triton"),
])
def test_backends_that_cannot_read_the_cache_are_refused(llama_dir, engine, fragment):
    with pytest.raises(SettingError, match=f"kv_cache_dtype.*{fragment}"):
        check_engine(EngineConfig(model=str(llama_dir), **engine))


def test_cli_refuses_it_with_exit_2(llama_dir, capsys):
    from folio.cli import main

    assert main(["serve", "--model", str(llama_dir), "--port", "0", "--device", "cuda",
                 "--kv-cache-dtype", "bfloat16"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "--kv-cache-dtype" in err[0], err


@pytest.mark.parametrize("kv_cache_dtype", ["int8", "fp8_e4m3"])
def test_forked_children_copy_quantized_blocks(llama_dir, kv_cache_dtype):
    """n=3 greedy: the children share the prompt's blocks and copy the partial last one
    (the block mover, rows and scales as bytes): each child gives the single run's tokens."""
    prompts, params = _prompts(count=4, seed=2)
    llm = LLM(str(llama_dir), dtype="float32", kv_cache_dtype=kv_cache_dtype,
              num_kv_blocks=256)
    single = [r.outputs[0].token_ids for r in llm.generate(prompts, params)]
    forked = llm.generate(prompts, [SamplingParams(n=3, temperature=0,
                                                   max_tokens=p.max_tokens) for p in params])
    stats = llm.stats()
    for result, expected in zip(forked, single):
        assert [o.token_ids for o in result.outputs] == [expected] * 3
    assert stats["forks"] == 2 * len(prompts)
    assert _idle(stats)


def test_simulate_sizes_pools_as_the_executor_does(llama_dir):
    from folio.executor.kv_cache import bytes_per_block
    from folio.executor.models.hf_config import read_model_config
    from folio.kernels.kv_quant import kv_storage_dtype
    from folio.planner.simulator.command import blocks_in_memory

    model = read_model_config(str(llama_dir))
    for name, kv_dtype in (("float32", "auto"), ("bfloat16", "bfloat16"), ("int8", "int8"),
                           ("fp8_e5m2", "fp8_e5m2")):
        storage = kv_storage_dtype(kv_dtype, torch.float32)
        assert blocks_in_memory(model, 1.0, 16, name) == \
            2**30 // bytes_per_block(model, 16, storage)
