"""The causal depthwise convolution the recurrent layers run over their inputs, with its
state: the last (kernel - 1) inputs of each channel, so a request's next tokens continue it.
A fresh request's window is zeros (the same as left zero padding)."""

from __future__ import annotations

import torch
import torch.nn.functional as F

from folio.kernels import cpu_recurrent

# What the C++ decode step (kernels/cpu/short_conv.cpp) computes in; others run in torch.
NATIVE_DTYPES = (torch.float32, torch.bfloat16)


def causal_conv(x: torch.Tensor, window: torch.Tensor, weight: torch.Tensor,
                bias: torch.Tensor | None) -> tuple[torch.Tensor, torch.Tensor]:
    """x [B, C, L] after `window` [B, C, K-1]; weight [C, 1, K]. Returns the outputs
    [B, C, L] and the new window (the last K-1 inputs)."""
    joined = torch.cat((window.to(x.dtype), x), dim=-1)
    out = F.conv1d(joined, weight, bias, groups=x.shape[1])
    return out, joined[..., joined.shape[-1] - window.shape[-1]:]


def step_in_pool(x: torch.Tensor, windows: torch.Tensor, weight: torch.Tensor,
                 bias: torch.Tensor | None, slots: torch.Tensor,
                 fresh: list[bool]) -> torch.Tensor:
    """One token for each of B requests in C++ on CPU: x [B, C]; each request's window is
    read (zeros when fresh) and shifted in its slot of `windows` [S, C, K-1], none gathered.
    Returns the outputs [B, C]."""
    return cpu_recurrent.causal_conv_step_cpu(x, windows, weight, bias, slots, fresh)
