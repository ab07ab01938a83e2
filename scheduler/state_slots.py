"""A hybrid model's recurrent state slots: one fixed-size slot per request holding its state
over every recurrent layer (linear attention, short convolution), beside the paged KV
blocks of its attention layers. Only KVCacheManager calls it: a request takes a slot when it
is admitted and gives it back when it is preempted (recomputed) or ends, so every slot is
free when the engine is idle. The executor holds the states in a pool addressed by the same
slot numbers (executor/models/hybrid/state_pool.py)."""

from __future__ import annotations


class StateSlots:
    def __init__(self, num_slots: int, slot_bytes: int) -> None:
        self.num_slots = num_slots
        self.slot_bytes = slot_bytes
        self._free = list(range(num_slots - 1, -1, -1))   # pop() takes the lowest
        self._owner: dict[int, int] = {}                   # slot -> request handle

    @property
    def enabled(self) -> bool:
        return self.num_slots > 0

    @property
    def num_free(self) -> int:
        return len(self._free)

    @property
    def num_used(self) -> int:
        return self.num_slots - len(self._free)

    def take(self, handle: int) -> int:
        """A free slot for request `handle`; the caller checked num_free."""
        slot = self._free.pop()
        self._owner[slot] = handle
        return slot

    def give_back(self, slot: int) -> None:
        if self._owner.pop(slot, None) is None:
            raise ValueError(f"state slot {slot} given back while free")
        self._free.append(slot)

    def owners(self) -> dict[int, int]:
        """Used slots -> the handle holding each (a copy)."""
        return dict(self._owner)
