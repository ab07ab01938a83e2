"""LoRA adapters under tensor parallelism (two gloo ranks through `folio serve`): each rank
holds its share of every adapter (B's rows for the column-parallel projections, A's columns
for the row-parallel ones), and greedy output with several adapters and the base mixed in
one batch is token-identical to transformers + PEFT in float32 (docs/lora.md)."""

from __future__ import annotations

import asyncio

import pytest

from folio import SamplingParams
from folio.client import AsyncClient
from tests.http_server import HttpServer
from tests.lora_adapters import MAX_TOKENS, PROMPTS

pytestmark = pytest.mark.parity
NAMES = ["all", "qv-down", "mlp", None]   # fused qkv in part, row-parallel down, gate/up


def test_adapters_on_two_ranks_match_peft(tmp_path, long_llama_dir, lora_adapters,
                                          lora_expected):
    modules = [f"{name}={lora_adapters[name]}" for name in NAMES if name]
    server = HttpServer(long_llama_dir, tmp_path, "--tensor-parallel-size", "2",
                        "--dtype", "float32", "--max-model-len", "1024", "--enable-lora",
                        "--max-loras", "3", "--lora-modules", *modules)
    try:
        server.wait_ready()

        async def run() -> dict:
            async with AsyncClient(server.zmq_address) as client:
                jobs = [(name, i) for name in NAMES for i in range(len(PROMPTS))]
                done = await asyncio.gather(*(
                    client.generate(PROMPTS[i], SamplingParams(
                        temperature=0.0, max_tokens=MAX_TOKENS[i]), lora=name)
                    for name, i in jobs))
                got: dict = {}
                for (name, _), completion in zip(jobs, done):
                    got.setdefault(name, []).append(completion.token_ids)
                return got

        assert asyncio.run(run()) == {name: lora_expected[name] for name in NAMES}
        assert "tensor parallel: 2 ranks" in server.log.read_text()
    finally:
        server.stop()


def test_loading_adapters_while_serving_is_refused_with_tensor_parallelism(long_llama_dir):
    from folio.checks import check_lora_names
    from folio.shared.config import EngineConfig
    from folio.shared.service_settings import HttpSettings
    from folio.shared.settings import SettingError

    engine = EngineConfig(model=str(long_llama_dir), enable_lora=True, tensor_parallel_size=2)
    with pytest.raises(SettingError, match="enable_lora_runtime_updates.*tensor_parallel"):
        check_lora_names(engine, HttpSettings(enable_lora_runtime_updates=True))
    check_lora_names(engine, HttpSettings())   # start-time adapters are served
