"""What the executor checks and prints for a hybrid model before it starts: the features
that cannot run with recurrent state yet are refused by name, and the start banner counts
the state in its tokens per GiB."""

from __future__ import annotations

from folio.executor.model_config import ModelConfig
from folio.shared.config import EngineConfig


def unsupported(config: EngineConfig, model: ModelConfig, tensor_parallel: bool = False
                ) -> tuple[str, str] | None:
    """(setting, why) for the first feature a hybrid cannot run with yet; None if none."""
    refused = [
        (tensor_parallel or config.tensor_parallel_size > 1, "tensor_parallel_size",
         "tensor parallelism"),
        (config.enable_lora, "enable_lora", "LoRA adapters"),
        (model.prequantized is not None, "model", "a pre-quantized checkpoint"),
    ]
    for hit, setting, what in refused:
        if hit:
            return setting, (f"{model.architecture} (a hybrid model with recurrent state) "
                             f"does not run with {what} yet")
    return None


def refuse_unsupported(config: EngineConfig, model: ModelConfig, tensor_parallel: bool) -> None:
    problem = unsupported(config, model, tensor_parallel)
    if problem is not None:
        raise ValueError(f"{problem[0]}: {problem[1]}")


def tokens_per_gib(bytes_per_block: int, block_size: int, state_bytes: int,
                   context: int) -> int:
    """Tokens one GiB of cache holds: the KV of the attention layers per token, plus one
    request's fixed state spread over a full context."""
    per_token = bytes_per_block / block_size + state_bytes / max(context, 1)
    return int(2**30 // per_token)


def state_banner(num_slots: int, state_bytes: int, context: int) -> str:
    if not num_slots:
        return ""
    return (f" with a {state_bytes / 2**20:.2f} MiB recurrent state per request counted "
            f"over a {context}-token context; {num_slots} state slots")
