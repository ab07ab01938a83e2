"""Where a Gemma 4 GGUF file's kept quantized linears go (executor/quantization/gguf/
quantized.py keeps them): Gemma4CausalLM's modules carry the checkpoint's names without
`model.`, q/k/v fused into qkv_proj on the layers that keep a KV cache (q alone on the
KV-shared ones) and gate/up into gate_up_proj."""

from __future__ import annotations

import re
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from folio.executor.quantization.gguf.gemma4.names import gemma4_hf_name

_FUSED = re.compile(r"^layers\.(\d+)\.(self_attn|mlp)\.(q_proj|k_proj|v_proj|gate_proj|"
                    r"up_proj)\.weight$")
_PARTS = {"q_proj": ("qkv_proj", 0), "k_proj": ("qkv_proj", 1), "v_proj": ("qkv_proj", 2),
          "gate_proj": ("gate_up_proj", 0), "up_proj": ("gate_up_proj", 1)}


@dataclass(frozen=True)
class Gemma4WeightNames:
    """target(name) -> (parameter, expert, part) as keep_gguf_quantized reads it; None for a
    tensor the model does not hold (a KV-shared layer's k/v)."""

    kv_source: tuple[int, ...]

    def target(self, name: str) -> tuple[str, None, int | None] | None:
        name = name.removeprefix("model.")
        match = _FUSED.match(name)
        if match is None:
            return name, None, None
        layer, block, proj = int(match.group(1)), match.group(2), match.group(3)
        owns = self.kv_source[layer] == layer
        if proj in ("k_proj", "v_proj") and not owns:
            return None
        if proj == "q_proj" and not owns:
            return name, None, None   # q_proj stays its own linear there
        fused, part = _PARTS[proj]
        return f"layers.{layer}.{block}.{fused}.weight", None, part


# The per-layer input table is an embedding, never a linear's weight (and the largest
# tensor of the PLE models): not re-expressed for nothing.
_NOT_LINEAR = frozenset({"per_layer_token_embd.weight"})


def gemma4_kept_names(reader: Any) -> Iterator[tuple[Any, str]]:
    """(tensor, Hugging Face name) of each 2-D tensor that may be a linear's weight (the
    token embedding too: a tied LM head's); the caller keeps the quantized ones (no
    reordering: the converter moves no row of Gemma 4's)."""
    for tensor in reader.tensors:
        name = gemma4_hf_name(tensor.name)
        if name is not None and len(tensor.shape) == 2 and tensor.name not in _NOT_LINEAR:
            yield tensor, name
