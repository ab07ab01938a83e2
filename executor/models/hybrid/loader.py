"""Builds a hybrid model from a Hugging Face checkpoint or a GGUF file (its tensors put back
under the checkpoint's names by executor/quantization/gguf/hybrid/): its modules carry the
checkpoint's own names, so each tensor is copied to the parameter of the same name."""

from __future__ import annotations

from pathlib import Path

import torch

from folio.executor.model_config import ModelConfig
from folio.executor.materialize import materialize
from folio.executor.models.hybrid.layers import Norm
from folio.executor.models.hybrid.model import HybridCausalLM
from folio.executor.models.hybrid.moe_weights import checkpoint_pieces
from folio.executor.ops import KernelOps
from folio.executor.quantization.gguf.file import is_gguf
from folio.executor.weights import iterate_weights

# Prefixes of tensors a text-only hybrid does not use: the vision tower and the
# multi-token-prediction head (Qwen3.5); and the prefixes stripped from the others.
_SKIPPED = ("model.visual.", "mtp.", "model.mtp.")
_STRIPPED = ("model.language_model.", "model.")


def load_hybrid_model(model_dir: str | Path, config: ModelConfig, ops: KernelOps,
                      dtype: torch.dtype, device: torch.device,
                      max_positions: int) -> HybridCausalLM:
    with torch.device("meta"):
        model = HybridCausalLM(config, ops, max_positions)
    model = materialize(model, device, dtype)
    _keep_float32(model)
    if is_gguf(model_dir):
        _hold_stored_scales(model)
    params = dict(model.named_parameters())
    written: dict[str, int] = {}   # elements copied into each parameter
    for name, tensor in iterate_weights(model_dir):
        if name.endswith("rotary_emb.inv_freq") or name.startswith(_SKIPPED):
            continue
        target = next((name[len(p):] for p in _STRIPPED if name.startswith(p)), name)
        pieces = checkpoint_pieces(target, tensor, config) or [(target, None, tensor)]
        for target, index, piece in pieces:
            if target not in params:
                raise ValueError(f"checkpoint tensor {name!r} has no place in "
                                 f"{config.architecture}")
            with torch.no_grad():
                place = params[target] if index is None else params[target][index]
                if tuple(place.shape) != tuple(piece.shape):
                    raise ValueError(f"shape mismatch for {name!r}: checkpoint "
                                     f"{tuple(piece.shape)} vs model {tuple(place.shape)}")
                place.copy_(piece)
            written[target] = written.get(target, 0) + place.numel()
    filled = {target for target, count in written.items() if count >= params[target].numel()}
    if config.tie_word_embeddings:
        model.lm_head.weight = model.embed_tokens.weight
        filled.add("lm_head.weight")
    missing = sorted(set(params) - filled)
    if missing:
        raise ValueError(f"checkpoint is missing {len(missing)} tensor(s), e.g. {missing[:3]}")
    model.init_rotary()
    return model.eval()


class HybridWeightNames:
    """Where executor/quantization/gguf/quantized.py puts a kept GGUF weight: the parameter
    of the checkpoint's own name (these modules carry it), no fusing or experts."""

    @staticmethod
    def target(name: str) -> tuple[str, None, None] | None:
        if name.startswith(_SKIPPED):
            return None
        return next((name[len(p):] for p in _STRIPPED if name.startswith(p)), name), None, None


def _hold_stored_scales(model: torch.nn.Module) -> None:
    """A GGUF file stores a zero-centred norm's weight as its scale 1 + weight (in float32):
    the norm multiplies by it as it is (offset 0), kept in float32 (in bfloat16 the scale
    would lose the weight's low bits, which 1 + weight computed in float32 keeps)."""
    for module in model.modules():
        if isinstance(module, Norm) and module.zero_centred:
            module.offset = 0.0
            module.weight = torch.nn.Parameter(module.weight.float(), requires_grad=False)


def _keep_float32(model: torch.nn.Module) -> None:
    """Parameters a module names in float32_parameters stay float32 (LFM2-MoE's expert
    bias, a float32 buffer in transformers too)."""
    for module in model.modules():
        for name in getattr(module, "float32_parameters", ()):
            param = getattr(module, name, None)
            if param is not None:
                setattr(module, name, torch.nn.Parameter(param.float(), requires_grad=False))
