"""A LoRA adapter directory in PEFT's format (adapter_config.json + adapter_model.safetensors)
checked against a model without reading its weights or importing torch, so `folio serve`
refuses a bad --lora-modules entry before any process starts (docs/lora.md).

The result says, for each adapter module, which Folio module (and which slice of a fused
one) it changes, its rank and its scale (alpha / r, or alpha / sqrt(r) with rsLoRA).
"""

from __future__ import annotations

import json
import math
import re
from dataclasses import dataclass
from pathlib import Path

from folio.executor.model_config import ModelConfig
from folio.executor.models.weight_names import WeightNames
from folio.shared.safetensors_header import SafetensorsError, read_shapes

CONFIG_FILE = "adapter_config.json"
WEIGHTS_FILE = "adapter_model.safetensors"
# Folio modules an adapter may change: each layer's attention and dense MLP projections.
TARGETS = ("self_attn.qkv_proj", "self_attn.o_proj", "mlp.gate_up_proj", "mlp.down_proj")
_PREFIX = "base_model.model."
_KEY = re.compile(r"^(?P<module>.+)\.lora_(?P<ab>[AB])(\.default)?\.weight$")


class LoraError(ValueError):
    """An adapter Folio cannot serve; the message names the cause."""


@dataclass(frozen=True)
class ModulePart:
    module: str        # Folio module path, e.g. "layers.3.self_attn.qkv_proj"
    part: int | None   # the slice of a fused module (q, k, v / gate, up), None if unfused
    key_a: str         # tensor names in adapter_model.safetensors
    key_b: str
    rank: int
    scale: float


def target_shapes(config: ModelConfig) -> dict[str, tuple[int, int]]:
    """(in, out) of every module an adapter may change, by Folio module path."""
    q_size = config.num_heads * config.head_dim
    qkv = q_size + 2 * config.num_kv_heads * config.head_dim
    sizes = {"self_attn.qkv_proj": (config.hidden_size, qkv),
             "self_attn.o_proj": (q_size, config.hidden_size),
             "mlp.gate_up_proj": (config.hidden_size, 2 * config.intermediate_size),
             "mlp.down_proj": (config.intermediate_size, config.hidden_size)}
    shapes = {}
    for layer in range(config.num_layers):
        sparse = config.moe is not None and config.moe.sparse_layers[layer]
        for target in TARGETS:
            if not (sparse and target.startswith("mlp.")):
                shapes[f"layers.{layer}.{target}"] = sizes[target]
    return shapes


def fused_sizes(module: str, out_size: int, config: ModelConfig) -> list[int]:
    """Row counts of a fused module's slices: q, k, v or gate, up."""
    if module.endswith("qkv_proj"):
        kv = config.num_kv_heads * config.head_dim
        return [config.num_heads * config.head_dim, kv, kv]
    return [out_size // 2, out_size // 2]


def plan_adapter(name: str, path: str | Path, config: ModelConfig, names: WeightNames,
                 max_rank: int) -> list[ModulePart]:
    """Every check of an adapter against the model; a problem is a LoraError naming it."""
    directory = Path(path)
    settings = _read_config(directory)
    shapes_in_file = _read_header(directory)
    use_rslora = bool(settings.get("use_rslora", False))
    alpha = settings.get("lora_alpha", 8)
    alpha_pattern = settings.get("alpha_pattern") or {}
    found: dict[str, dict[str, str]] = {}   # adapter module -> {"A": key, "B": key}
    for key in shapes_in_file:
        match = _KEY.match(key.removeprefix(_PREFIX))
        if match is None:
            raise LoraError(f"adapter {name!r}: tensor {key!r} is not a LoRA A or B weight "
                            "(embeddings, DoRA magnitudes and saved modules are not supported)")
        found.setdefault(match["module"], {})[match["ab"]] = key
    if not found:
        raise LoraError(f"adapter {name!r}: {WEIGHTS_FILE} holds no LoRA weights")
    shapes = target_shapes(config)
    parts = []
    for module, keys in sorted(found.items()):
        if set(keys) != {"A", "B"}:
            raise LoraError(f"adapter {name!r}: module {module!r} has lora_{''.join(keys)} "
                            "but not its pair")
        target = names.target(module + ".weight")
        folio_module = None if target is None or target[1] is not None \
            else target[0].removesuffix(".weight")
        if folio_module is None or folio_module not in shapes:
            raise LoraError(f"adapter {name!r}: target module {module!r} is not one the "
                            "model has for LoRA (the attention and dense MLP projections of "
                            f"{config.architecture})")
        a, b = shapes_in_file[keys["A"]], shapes_in_file[keys["B"]]
        if len(a) != 2 or len(b) != 2 or b[1] != a[0]:
            raise LoraError(f"adapter {name!r}: {module!r} has lora_A {a} and lora_B {b}, "
                            "not [r, in] and [out, r]")
        rank = a[0]
        if rank > max_rank:
            raise LoraError(f"adapter {name!r}: {module!r} has rank {rank}, over "
                            f"--max-lora-rank {max_rank}")
        part = target[2]
        in_size, out_size = shapes[folio_module]
        want_out = out_size if part is None else fused_sizes(folio_module, out_size,
                                                             config)[part]
        if a[1] != in_size or b[0] != want_out:
            raise LoraError(f"adapter {name!r}: {module!r} maps {a[1]} -> {b[0]} features; "
                            f"the model's maps {in_size} -> {want_out} (an adapter for "
                            "another base model?)")
        module_alpha = _pattern_value(alpha_pattern, module, alpha)
        if isinstance(module_alpha, bool) or not isinstance(module_alpha, (int, float)):
            raise LoraError(f"adapter {name!r}: lora_alpha must be a number, got "
                            f"{module_alpha!r}")
        scale = module_alpha / (math.sqrt(rank) if use_rslora else rank)
        parts.append(ModulePart(folio_module, part, keys["A"], keys["B"], rank, scale))
    return parts


def _read_config(directory: Path) -> dict:
    file = directory / CONFIG_FILE
    try:
        settings = json.loads(file.read_text())
    except FileNotFoundError:
        raise LoraError(f"no LoRA adapter at {str(directory)!r}: {CONFIG_FILE} is missing") \
            from None
    except (OSError, ValueError) as error:
        raise LoraError(f"cannot read {str(file)!r}: {error}") from None
    if not isinstance(settings, dict):
        raise LoraError(f"{str(file)!r} is not a JSON object")
    kind = settings.get("peft_type", "LORA")
    if kind != "LORA":
        raise LoraError(f"{str(file)!r}: peft_type {kind!r} is not LORA")
    if settings.get("use_dora"):
        raise LoraError(f"{str(file)!r}: DoRA adapters (use_dora) are not supported")
    if settings.get("bias", "none") != "none":
        raise LoraError(f"{str(file)!r}: bias {settings['bias']!r} is not supported (none)")
    if settings.get("modules_to_save"):
        raise LoraError(f"{str(file)!r}: modules_to_save is not supported")
    return settings


def _read_header(directory: Path) -> dict[str, tuple[int, ...]]:
    """Tensor name -> shape, from the safetensors header; the bytes must lie in the file."""
    file = directory / WEIGHTS_FILE
    if not file.is_file():
        raise LoraError(f"no LoRA weights at {str(directory)!r}: {WEIGHTS_FILE} is missing "
                        "(adapter_model.bin is not read)")
    try:
        return read_shapes(file)
    except SafetensorsError:
        raise LoraError(f"{str(file)!r} is not a readable safetensors file") from None


def _pattern_value(patterns: dict, module: str, default):
    for key, value in patterns.items():
        if re.fullmatch(rf"(.*\.)?{key}", module):
            return value
    return default
