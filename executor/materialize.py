"""Allocates a model built on the meta device."""

from __future__ import annotations

import torch
from torch import nn


def materialize(model: nn.Module, device: torch.device, dtype: torch.dtype) -> nn.Module:
    """`model.to_empty(device=device).to(dtype)` for a model built on the meta device:
    uninitialized tensors, floating ones in `dtype`, each module's its own (as to_empty
    gives). Written out because to_empty goes through torch's reference empty_like, whose
    first call imports sympy: half a second of every executor's start."""
    for module in model.modules():
        for table in (module._parameters, module._buffers):
            for name, tensor in table.items():
                if tensor is None:
                    continue
                made = torch.empty(tensor.shape, device=device, dtype=(
                    dtype if tensor.is_floating_point() else tensor.dtype))
                table[name] = (nn.Parameter(made, requires_grad=tensor.requires_grad)
                               if isinstance(tensor, nn.Parameter) else made)
    return model
