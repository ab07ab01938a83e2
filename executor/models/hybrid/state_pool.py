"""The executor's recurrent states, addressed by slot as the KV cache is by block.

Slot s of every recurrent layer holds one request's state: the convolution window
[C, K-1] (model dtype) and, for a Gated DeltaNet layer, its [H, Dk, Dv] matrices (float32).
The scheduler owns the slots (scheduler/kv/state_slots.py) and sends a request's slot once,
with the request (docs/protocol.md, plan `n.st`); a request whose first token computed is
position 0 starts from zeros, so a slot is never cleared when it changes owner.

Speculative decoding: a sequence verifying drafts runs its tokens one decode step at a time
and its layers keep the state after each of them (StepStates.held) instead of writing the
slot; once the drafts are verified, `commit` writes the state after the last accepted token
(docs/hybrid.md), so the slot holds what feeding only the accepted tokens would leave."""

from __future__ import annotations

from dataclasses import dataclass, field

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
    # Per sequence: (tokens into this step's part of it, slot) where its state is copied
    # into a checkpoint slot for the prefix cache; empty lists when none.
    checkpoints: list[list[tuple[int, int]]]
    # Per sequence: it verifies drafts (its state is held per position, not written).
    drafted: list[bool] = field(default_factory=list)
    # Filled by the layers: (pool tensor, sequence, its states after each of its tokens).
    held: list[tuple[torch.Tensor, int, torch.Tensor]] = field(default_factory=list)


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

    def tensors(self) -> list[torch.Tensor]:
        """Every layer's pool, in one fixed order: a slot is row s of each (swaps move
        rows between a device pool and a host pool of the same layout)."""
        return [*self.conv.values(), *self.delta.values()]

    def copy(self, pairs: list[tuple[int, int]]) -> None:
        """Start request slots from checkpoints: (source, destination), every layer."""
        if not pairs:
            return
        src = torch.tensor([s for s, _ in pairs], device=self.device)
        dst = torch.tensor([d for _, d in pairs], device=self.device)
        for tensors in (self.conv, self.delta):
            for pool in tensors.values():
                pool[dst] = pool[src]

    def step(self, slots: list[int], begins: list[int], starts: list[int],
             checkpoints: dict[int, list[tuple[int, int]]] | None = None,
             handles: list[int] | None = None, drafted: list[bool] | None = None
             ) -> StepStates:
        """`checkpoints`: by handle, (tokens of the sequence, slot) from the plan;
        `drafted`: per sequence, whether its tokens after the first are drafts."""
        counts = [b - a for a, b in zip(starts, starts[1:])]
        per_sequence: list[list[tuple[int, int]]] = [[] for _ in slots]
        if checkpoints:
            for i, handle in enumerate(handles):
                for tokens, slot in checkpoints.get(handle, ()):
                    offset = tokens - begins[i]
                    if not 0 < offset <= counts[i]:
                        raise ValueError(f"checkpoint at {tokens} tokens is outside the "
                                         f"step's part of request {handle}")
                    if drafted and drafted[i] and offset != 1:
                        raise ValueError(f"checkpoint at {tokens} tokens falls on a draft "
                                         f"of request {handle}, not its verified token")
                    per_sequence[i].append((offset, slot))
                per_sequence[i].sort()
        drafted = drafted or [False] * len(slots)
        return StepStates(torch.tensor(slots, dtype=torch.int64, device=self.device),
                          [begin == 0 for begin in begins], starts,
                          all(count == 1 for count in counts) and not checkpoints,
                          per_sequence, drafted)

    def commit(self, states: StepStates, kept: list[int]) -> None:
        """After verification: each drafted sequence's slot takes the state after its
        `kept[i]` first tokens (the verified one plus the drafts accepted)."""
        slots = states.slots.tolist()
        for pool, i, per_position in states.held:
            pool[slots[i]] = per_position[kept[i] - 1]
