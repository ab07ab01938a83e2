"""What Gemma 4 cannot run with yet, refused by name before start (folio/preflight.py) and
again by the executor: each needs the uniform layers Gemma 4 does not have."""

from __future__ import annotations

from folio.executor.model_config import ModelConfig
from folio.shared.config import EngineConfig


def unsupported(config: EngineConfig, model: ModelConfig, tensor_parallel: bool = False
                ) -> tuple[str, str] | None:
    """(setting, why) for the first feature Gemma 4 cannot run with yet; None if none."""
    refused = [
        (tensor_parallel or config.tensor_parallel_size > 1, "tensor_parallel_size",
         "tensor parallelism (its sharding rules assume one head size and KV-head count)"),
        (config.enable_lora, "enable_lora", "LoRA adapters (they target fused q/k/v and "
         "gate/up projections)"),
        (model.prequantized is not None, "model", "a pre-quantized checkpoint"),
    ]
    for hit, setting, what in refused:
        if hit:
            return setting, f"{model.architecture} (Gemma 4) does not run with {what} yet"
    return None


def refuse_unsupported(config: EngineConfig, model: ModelConfig, tensor_parallel: bool) -> None:
    problem = unsupported(config, model, tensor_parallel)
    if problem is not None:
        raise ValueError(f"{problem[0]}: {problem[1]}")
