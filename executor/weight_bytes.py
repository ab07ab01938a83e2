"""The bytes of weights one decode step reads from memory, whatever the batch: every linear
layer, norm and lm_head whole, and one embedding row per token (negligible, not counted).

It is the numerator of the decode step's effective bandwidth (`folio:decode_weight_read_gbps`,
bench/bandwidth.py): a one-user step cannot take less than these bytes over the machine's
copy bandwidth.
"""

from __future__ import annotations

import torch
from torch import nn


def weight_bytes_per_step(model: nn.Module) -> int:
    embedding = getattr(model, "embed_tokens", None)
    head_weight = getattr(getattr(model, "lm_head", None), "weight", None)
    # A tied float lm_head reads the embedding matrix every step: count it there, once.
    skipped = embedding.weight if (isinstance(embedding, nn.Embedding)
                                   and head_weight is not embedding.weight) else None
    tensors = {id(t): t for t in (*model.parameters(), *model.buffers())
               if t is not skipped and isinstance(t, torch.Tensor)}
    return sum(t.numel() * t.element_size() for t in tensors.values())
