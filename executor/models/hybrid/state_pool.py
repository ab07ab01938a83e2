"""The executor's recurrent states, addressed by slot as the KV cache is by block.

Slot s of every recurrent layer holds one request's state: the convolution window
[C, K-1] (model dtype) and, for a Gated DeltaNet layer, its [H, Dk, Dv] matrices (float32).
The scheduler owns the slots (scheduler/state_slots.py) and sends a request's slot once,
with the request (docs/protocol.md, plan `n.st`); a request whose first token computed is
position 0 starts from zeros, so a slot is never cleared when it changes owner."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from folio.executor.models.hybrid.spec import CONV, LINEAR, HybridSpec


@dataclass(frozen=True)
class StepStates:
    """One step's view of the pool, in the order of the step's sequences."""

    slots: torch.Tensor          # [S] int64, on the pool's device
    fresh: list[bool]            # the sequence starts at position 0: its state is zeros
    starts: list[int]            # query_start_loc on the host: sequence i is tokens
                                 # starts[i]:starts[i + 1]
    decode_only: bool            # every sequence has one token (the batched path)


class StatePool:
    def __init__(self, spec: HybridSpec, num_slots: int, dtype: torch.dtype,
                 device: torch.device) -> None:
        self.num_slots = num_slots
        window = spec.conv_kernel - 1
        self.conv: dict[int, torch.Tensor] = {}
        self.delta: dict[int, torch.Tensor] = {}
        for layer, kind in enumerate(spec.layer_kinds):
            if kind in (LINEAR, CONV):
                self.conv[layer] = torch.zeros(num_slots, spec.conv_channels, window,
                                               dtype=dtype, device=device)
            if kind == LINEAR:
                self.delta[layer] = torch.zeros(num_slots, spec.num_v_heads, spec.k_head_dim,
                                                spec.v_head_dim, dtype=torch.float32,
                                                device=device)
        self.device = device

    def step(self, slots: list[int], begins: list[int], starts: list[int]) -> StepStates:
        counts = [b - a for a, b in zip(starts, starts[1:])]
        return StepStates(torch.tensor(slots, dtype=torch.int64, device=self.device),
                          [begin == 0 for begin in begins], starts,
                          all(count == 1 for count in counts))
