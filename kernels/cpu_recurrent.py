"""Python faces of the hybrids' recurrent decode steps in C++ (kernels/cpu/gated_delta.cpp,
kernels/cpu/short_conv.cpp) and of the delta rule over a prompt (kernels/cpu/
gated_delta_chunk.cpp), on the executor's state pool in place.

They are built and loaded with the attention operator (kernels.cpu_attention), so
`cpu_attention.load().ok` says whether they can run; their meaning is the torch code in
executor/models/hybrid/ (gated_delta.recurrent and gated_delta.chunked, short_conv.causal_conv),
which runs when the C++ operators are not built (the executor's start log says which).
"""

from __future__ import annotations

import torch

from folio.kernels import cpu_attention


def runs_native(kernel_set: str) -> bool:
    """Whether the recurrent layers' decode steps (and the delta rule's prompts) run in C++
    here: with the C++ CPU kernel set
    (executor/ops.py's "cpu", chosen when the library is built), whose library holds them."""
    return kernel_set == "cpu"


def describe(device: torch.device, kernel_set: str) -> str:
    """One line for the start log: which code runs the recurrent layers' decode steps and
    the delta rule's prompts."""
    if kernel_set == "triton":   # interpreted on CPU, where the decode steps stay in torch
        if device.type == "cuda":
            return "recurrent layers: Triton delta-rule decode steps and prompts"
        return "recurrent layers: torch decode steps and Triton delta-rule prompts"
    if device.type != "cpu":
        return "recurrent layers: torch (the delta rule's decode step: Triton on CUDA)"
    if runs_native(kernel_set):
        return (f"recurrent layers: C++ CPU decode steps and delta-rule prompts "
                f"({cpu_attention.load().detail})")
    status = cpu_attention.load()
    why = ("attention_backend='torch' chose the torch kernels" if status.ok
           else f"the C++ CPU operators are unavailable: {status.detail}")
    return f"recurrent layers: torch decode steps and prompts, because {why}"


def gated_delta_step_cpu(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, g: torch.Tensor,
                         beta: torch.Tensor, pool: torch.Tensor, slots: torch.Tensor,
                         fresh: list[bool]) -> torch.Tensor:
    """One token for each of B requests: q, k [B, H, Dk] float32 (prepared as
    gated_delta.prepare_qk does), v [B, H, Dv] float32 or bfloat16, g, beta [B, H] float32;
    pool [S, H, Dk, Dv] float32, request b's state at slots[b] (int64), read (zeros where
    fresh[b]) and written back in place. Returns the outputs [B, H, Dv] float32."""
    out = torch.empty(v.shape, dtype=torch.float32)
    torch.ops.folio.gated_delta_step(out, q, k, v, g, beta, pool, slots, fresh)
    return out


def causal_conv_step_cpu(x: torch.Tensor, windows: torch.Tensor, weight: torch.Tensor,
                         bias: torch.Tensor | None, slots: torch.Tensor,
                         fresh: list[bool]) -> torch.Tensor:
    """One token for each of B requests: x [B, C]; windows [S, C, K-1], request b's window
    at slots[b], read (zeros where fresh[b]) and shifted in place; weight [C, 1, K], bias
    [C] or None; one dtype, float32 or bfloat16. Returns the outputs [B, C]."""
    out = torch.empty(x.shape, dtype=x.dtype)
    torch.ops.folio.causal_conv_step(out, x, windows, weight, bias, slots, fresh)
    return out


def gated_delta_prompt_cpu(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, g: torch.Tensor,
                           beta: torch.Tensor, pool: torch.Tensor, slot: int,
                           fresh: bool) -> torch.Tensor:
    """L tokens of one request: q, k [L, H, Dk] float32 (prepared as gated_delta.prepare_qk
    does), v [L, H, Dv] float32 or bfloat16, g, beta [L, H] float32; pool [S, H, Dk, Dv]
    float32, the request's state at `slot`, read (zeros where fresh) and left there after
    the L tokens, in place. Returns the outputs [L, H, Dv] float32."""
    out = torch.empty(v.shape, dtype=torch.float32)
    torch.ops.folio.gated_delta_prompt(out, q, k, v, g, beta, pool, slot, fresh)
    return out
