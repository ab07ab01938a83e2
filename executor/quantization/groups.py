"""How `--quantization` groups each linear layer's input values, and which models it can
take: no torch import, so the command line's checks (folio/preflight.py) run it before any
process starts."""

from __future__ import annotations

from folio.executor.model_config import ModelConfig

# int8: one scale per output channel (a group is the whole input row), which fits any
# shape. int4: a scale and a min per 32 input values, GGUF's block; 32 measured better
# than 64 or 128 on SmolLM2-135M (docs/benchmarks.md, "Quality of the quantized paths").
INT4_GROUP = 32


def linear_inputs(config: ModelConfig, tensor_parallel_size: int = 1) -> dict[str, int]:
    """Input sizes (K) of the model's linear layers on one rank, by the layers that have it."""
    inputs = {"q/k/v, gate/up and lm_head": config.hidden_size,
              "o_proj": config.num_heads * config.head_dim // tensor_parallel_size,
              "down_proj": config.intermediate_size // tensor_parallel_size}
    if config.moe is not None:
        inputs["the experts' down_proj"] = config.moe.intermediate_size // tensor_parallel_size
    spec = config.gemma4
    if spec is not None:   # Gemma 4: its layers' own head sizes and MLP widths, and PLE
        for heads, dim in sorted(set(spec.layer_heads)):
            inputs[f"o_proj (head size {dim})"] = config.num_heads * dim
        for size in sorted(set(spec.mlp_sizes)):
            inputs[f"down_proj ({size} wide)"] = size
        if spec.per_layer_input_size:
            inputs["per_layer_projection"] = spec.per_layer_input_size
    hybrid = config.hybrid
    if hybrid is not None and hybrid.num_v_heads:   # Gated DeltaNet reads its value heads
        inputs["the Gated DeltaNet layers' out_proj"] = hybrid.num_v_heads * hybrid.v_head_dim
    return inputs


def quantization_problem(quantization: str, config: ModelConfig,
                         tensor_parallel_size: int = 1) -> str | None:
    """Why `quantization` cannot take this model's shapes, or None."""
    if quantization != "int4":
        return None
    for layers, size in linear_inputs(config, tensor_parallel_size).items():
        if size % INT4_GROUP:
            return (f"int4 quantizes groups of {INT4_GROUP} input values; {layers} of this "
                    f"model take {size}, not a multiple of {INT4_GROUP}")
    return None


def prequantized_problem(config: ModelConfig, tensor_parallel_size: int = 1) -> str | None:
    """Why a pre-quantized checkpoint's layout does not map onto this model, or None."""
    scheme = config.prequantized
    if scheme is None:
        return None
    if config.moe is not None or (config.gemma4 is not None and config.gemma4.moe is not None):
        return (f"{scheme.describe()}: pre-quantized mixture-of-experts checkpoints are not "
                "supported")
    if tensor_parallel_size > 1:
        return f"{scheme.describe()}: pre-quantized checkpoints run on one rank only"
    group = scheme.group or (INT4_GROUP if scheme.bits == 4 else None)
    for layers, size in linear_inputs(config).items():
        if group is not None and size % group:
            return (f"{scheme.describe()}: {layers} of this model take {size} input values, "
                    f"not a multiple of {group}")
    return None
