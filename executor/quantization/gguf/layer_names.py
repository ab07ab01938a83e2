"""Renaming a GGUF tensor by a family's two tables (its global tensors, and a layer's
tensors after `blk.N.`), for the families whose names follow no common layout (Gemma 4,
gpt-oss)."""

from __future__ import annotations

import re

LAYER = re.compile(r"^blk\.(\d+)\.(.+)$")


def renamed(gguf_name: str, global_names: dict[str, str], layer_names: dict[str, str]
            ) -> str | None:
    """The Hugging Face name of a tensor; None for one the tables have no place for."""
    if gguf_name in global_names:
        return global_names[gguf_name]
    match = LAYER.match(gguf_name)
    if match is None or match.group(2) not in layer_names:
        return None
    return f"model.layers.{match.group(1)}.{layer_names[match.group(2)]}"
