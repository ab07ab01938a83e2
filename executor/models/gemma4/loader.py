"""Builds Gemma 4's text decoder from a Hugging Face checkpoint: its modules carry the
checkpoint's own names, so each tensor is copied to the parameter of the same name.

A Gemma4ForConditionalGeneration checkpoint holds the decoder under model.language_model.;
its vision and audio towers (and their embedders) are skipped: Folio serves the text part.
Checkpoints may still hold k/v projections and norms for the layers that share another
layer's keys and values (transformers ignores them on load): those are skipped too.
"""

from __future__ import annotations

import re
from pathlib import Path

import torch

from folio.executor.materialize import materialize
from folio.executor.model_config import ModelConfig
from folio.executor.models.gemma4.model import Gemma4CausalLM
from folio.executor.ops import KernelOps
from folio.executor.weights import iterate_weights

_TOWERS = ("model.vision_tower.", "model.audio_tower.", "model.embed_vision.",
           "model.embed_audio.", "model.multi_modal_projector.")
_STRIPPED = ("model.language_model.", "model.")
_SHARED_KV = re.compile(r"^layers\.(\d+)\.self_attn\.(k_proj|v_proj|k_norm|v_norm)\.")


def load_gemma4_model(model_dir: str | Path, config: ModelConfig, ops: KernelOps,
                      dtype: torch.dtype, device: torch.device,
                      max_positions: int) -> Gemma4CausalLM:
    with torch.device("meta"):
        model = Gemma4CausalLM(config, ops, max_positions)
    model = materialize(model, device, dtype)
    params = dict(model.named_parameters())
    sources = config.gemma4.kv_source
    filled: set[str] = set()
    for name, tensor in iterate_weights(model_dir):
        if name.endswith("rotary_emb.inv_freq") or name.startswith(_TOWERS):
            continue
        target = next((name[len(p):] for p in _STRIPPED if name.startswith(p)), name)
        shared = _SHARED_KV.match(target)
        if shared is not None and sources[int(shared.group(1))] != int(shared.group(1)):
            continue
        if target not in params:
            raise ValueError(f"checkpoint tensor {name!r} has no place in "
                             f"{config.architecture}")
        param = params[target]
        if tuple(param.shape) != tuple(tensor.shape):
            raise ValueError(f"shape mismatch for {name!r}: checkpoint "
                             f"{tuple(tensor.shape)} vs model {tuple(param.shape)}")
        with torch.no_grad():
            param.copy_(tensor)
        filled.add(target)
    if config.tie_word_embeddings and "lm_head.weight" not in filled:
        model.lm_head.weight = model.embed_tokens.weight
        filled.add("lm_head.weight")
    missing = sorted(set(params) - filled)
    if missing:
        raise ValueError(f"checkpoint is missing {len(missing)} tensor(s), e.g. {missing[:3]}")
    model.fuse_projections()
    model.init_rotary()
    return model.eval()
