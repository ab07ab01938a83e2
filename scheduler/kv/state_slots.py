"""A hybrid model's recurrent state slots: one fixed-size slot per request holding its state
over every recurrent layer (linear attention, short convolution), beside the paged KV
blocks of its attention layers. Only KVCacheManager calls it: a request takes a slot when it
is admitted and gives it back when it is preempted (recomputed) or ends. The executor holds
the states in a pool addressed by the same slot numbers
(executor/models/hybrid/state_pool.py).

The prefix cache's checkpoints live in the same slots: a copy of a sequence's state after
its first p tokens (p a multiple of checkpoint_blocks blocks), keyed by the hash of the
block ending at p, so a later request sharing those blocks resumes from it. Checkpoints are
evicted least recently used first when a slot is needed, except those the step being
planned writes (the executor writes them during that step's forward pass, so their slot
cannot serve anyone else in it, and no request may copy from them in it). Steps run in
order, so a checkpoint written by an earlier step, even one still in flight, may be copied
from or handed out. A request's own earlier checkpoint that nobody has resumed from is
replaced by its deeper one: a conversation keeps its deepest state, not every stop on the
way. With no request running, every slot is free or a checkpoint."""

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
        self._planning_step = 0
        # Each request's newest checkpoint not yet resumed from: handle -> block hash.
        self._unread: dict[int, bytes] = {}

    @property
    def enabled(self) -> bool:
        return self.num_slots > 0

    @property
    def num_free(self) -> int:
        """Slots a request can take now: free ones and evictable checkpoints."""
        planning = self._planning_step
        return len(self._free) + sum(1 for _, step in self._checkpoints.values()
                                     if step < planning)

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

    def begin_step(self, step: int) -> None:
        self._planning_step = step

    def find_checkpoint(self, block_hash: bytes) -> int | None:
        """The slot holding the state after the block `block_hash` names (marked recently
        used), or None. Not one the step being planned writes: a resuming request's copy
        runs before that step's forward pass."""
        entry = self._checkpoints.get(block_hash)
        if entry is None or entry[1] >= self._planning_step:
            return None
        self._checkpoints.move_to_end(block_hash)
        for handle, unread in list(self._unread.items()):
            if unread == block_hash:   # resumed from: no longer replaceable
                del self._unread[handle]
        return entry[0]

    def add_checkpoint(self, block_hash: bytes, handle: int, evict: bool = True
                       ) -> int | None:
        """A slot for a checkpoint of request `handle` that the step being planned writes,
        or None when the hash has one already or there is no slot to spare (a free one,
        or with `evict` an evictable checkpoint). It replaces the request's previous
        checkpoint if nobody resumed from that one."""
        if block_hash in self._checkpoints:
            return None
        previous = self._unread.pop(handle, None) if evict else None   # the deepest only
        entry = self._checkpoints.get(previous) if previous is not None else None
        if entry is not None and entry[1] < self._planning_step:
            del self._checkpoints[previous]
            self._free.append(entry[0])
        if not (self._free if not evict else self.num_free):
            return None
        slot = self._take()
        self._checkpoints[block_hash] = (slot, self._planning_step)
        if evict:
            self._unread[handle] = block_hash
        return slot

    def forget(self, handle: int) -> None:
        """The request ended: its checkpoints stay, no longer replaced by it."""
        self._unread.pop(handle, None)

    def confirm_through(self, step: int) -> None:
        self._confirmed_step = max(self._confirmed_step, step)

    def discard_unconfirmed(self) -> None:
        """A step failed: the checkpoints of steps that never returned hold garbage."""
        for block_hash, (slot, step) in list(self._checkpoints.items()):
            if step > self._confirmed_step:
                del self._checkpoints[block_hash]
                self._free.append(slot)
        self._unread = {h: b for h, b in self._unread.items() if b in self._checkpoints}

    def _take(self, keep: int = -1) -> int:
        if self._free:
            return self._free.pop()
        for block_hash, (slot, step) in self._checkpoints.items():   # oldest first
            if step < self._planning_step and slot != keep:
                del self._checkpoints[block_hash]
                return slot
        raise RuntimeError("no state slot to take: the caller checks num_free")
