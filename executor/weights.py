"""Reads tensors from a checkpoint directory (one model.safetensors or a sharded index) or a
GGUF file (executor/quantization/gguf/weights.py)."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import torch
from safetensors import safe_open

from folio.executor.quantization.gguf.file import is_gguf
from folio.executor.quantization.gguf.weights import iterate_gguf_weights


def checkpoint_files(model_dir: str | Path) -> list[Path]:
    model_dir = Path(model_dir)
    index = model_dir / "model.safetensors.index.json"
    if index.is_file():
        weight_map = json.loads(index.read_text(encoding="utf-8"))["weight_map"]
        return [model_dir / name for name in sorted(set(weight_map.values()))]
    single = model_dir / "model.safetensors"
    if single.is_file():
        return [single]
    raise FileNotFoundError(f"no model.safetensors or model.safetensors.index.json in {model_dir}")


def checkpoint_tensor_names(model_dir: str | Path) -> list[str]:
    """Every tensor name of a safetensors checkpoint, from the headers (no data read)."""
    names = []
    for path in checkpoint_files(model_dir):
        with safe_open(str(path), framework="pt") as handle:
            names.extend(handle.keys())
    return names


def iterate_weights(model_dir: str | Path) -> Iterator[tuple[str, torch.Tensor]]:
    if is_gguf(model_dir):
        yield from iterate_gguf_weights(model_dir)
        return
    for path in checkpoint_files(model_dir):
        with safe_open(str(path), framework="pt") as handle:
            for name in handle.keys():
                yield name, handle.get_tensor(name)
