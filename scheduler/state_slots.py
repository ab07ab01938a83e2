"""A hybrid model's recurrent state slots: one fixed-size slot per request holding its state
over every recurrent layer (linear attention, short convolution), beside the paged KV
blocks of its attention layers. Only KVCacheManager calls it: a request takes a slot when it
is admitted and gives it back when it is preempted (recomputed) or ends. The executor holds
the states in a pool addressed by the same slot numbers
(executor/models/hybrid/state_pool.py).

The prefix cache's checkpoints live in the same slots: a copy of a sequence's state after
its first p tokens (p a multiple of checkpoint_blocks blocks), keyed by the hash of the
block ending at p, so a later request sharing those blocks resumes from it. Checkpoints are
evicted least recently used first when a slot is needed, except those whose step has not
run yet (the executor writes them during the step: the slot cannot be handed out before).
With no request running, every slot is free or a checkpoint."""

from __future__ import annotations

from collections import OrderedDict


class StateSlots:
    def __init__(self, num_slots: int, slot_bytes: int) -> None:
        self.num_slots = num_slots
        self.slot_bytes = slot_bytes
        self._free = list(range(num_slots - 1, -1, -1))   # pop() takes the lowest
        self._owner: dict[int, int] = {}                   # slot -> request handle
        # Checkpoints, least recently used first: block hash -> (slot, step that writes it).
        self._checkpoints: OrderedDict[bytes, tuple[int, int]] = OrderedDict()
        self._confirmed_step = -1

    @property
    def enabled(self) -> bool:
        return self.num_slots > 0

    @property
    def num_free(self) -> int:
        """Slots a request can take now: free ones and evictable checkpoints."""
        return len(self._free) + sum(1 for _, step in self._checkpoints.values()
                                     if step <= self._confirmed_step)

    @property
    def num_used(self) -> int:
        """Slots held by requests."""
        return len(self._owner)

    @property
    def num_checkpoints(self) -> int:
        return len(self._checkpoints)

    def take(self, handle: int, keep: int = -1) -> int:
        """A slot for request `handle`, not evicting checkpoint slot `keep`; the caller
        checked num_free (counting `keep` out)."""
        slot = self._take(keep)
        self._owner[slot] = handle
        return slot

    def give_back(self, slot: int) -> None:
        if self._owner.pop(slot, None) is None:
            raise ValueError(f"state slot {slot} given back while free")
        self._free.append(slot)

    def owners(self) -> dict[int, int]:
        """Slots held by requests -> the handle holding each (a copy)."""
        return dict(self._owner)

    def checkpoint_slots(self) -> list[int]:
        return [slot for slot, _ in self._checkpoints.values()]

    # ---- checkpoints ----------------------------------------------------------------------

    def find_checkpoint(self, block_hash: bytes, before_step: int) -> int | None:
        """The slot holding the state after the block `block_hash` names (marked recently
        used), or None. Only a checkpoint written by a step before `before_step`: a resuming
        request's copy runs before its step's forward pass, which writes that step's."""
        entry = self._checkpoints.get(block_hash)
        if entry is None or entry[1] >= before_step:
            return None
        self._checkpoints.move_to_end(block_hash)
        return entry[0]

    def add_checkpoint(self, block_hash: bytes, step: int) -> int | None:
        """A slot for a checkpoint that step `step` writes, or None when there is none to
        spare (no free slot, no evictable checkpoint) or the hash has one already."""
        if block_hash in self._checkpoints or not self.num_free:
            return None
        slot = self._take()
        self._checkpoints[block_hash] = (slot, step)
        return slot

    def confirm_through(self, step: int) -> None:
        self._confirmed_step = max(self._confirmed_step, step)

    def discard_unconfirmed(self) -> None:
        """A step failed: the checkpoints of steps that never returned hold garbage."""
        for block_hash, (slot, step) in list(self._checkpoints.items()):
            if step > self._confirmed_step:
                del self._checkpoints[block_hash]
                self._free.append(slot)

    def _take(self, keep: int = -1) -> int:
        if self._free:
            return self._free.pop()
        for block_hash, (slot, step) in self._checkpoints.items():   # oldest first
            if step <= self._confirmed_step and slot != keep:
                del self._checkpoints[block_hash]
                return slot
        raise RuntimeError("no state slot to take: the caller checks num_free")
