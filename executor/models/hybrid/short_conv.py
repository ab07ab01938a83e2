"""The causal depthwise convolution the recurrent layers run over their inputs, with its
state: the last (kernel - 1) inputs of each channel, so a request's next tokens continue it.
A fresh request's window is zeros (the same as left zero padding)."""

from __future__ import annotations

import torch
import torch.nn.functional as F


def causal_conv(x: torch.Tensor, window: torch.Tensor, weight: torch.Tensor,
                bias: torch.Tensor | None) -> tuple[torch.Tensor, torch.Tensor]:
    """x [B, C, L] after `window` [B, C, K-1]; weight [C, 1, K]. Returns the outputs
    [B, C, L] and the new window (the last K-1 inputs)."""
    joined = torch.cat((window.to(x.dtype), x), dim=-1)
    out = F.conv1d(joined, weight, bias, groups=x.shape[1])
    return out, joined[..., joined.shape[-1] - window.shape[-1]:]
