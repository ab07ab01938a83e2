"""The prefix cache's changes since the last publish, as vLLM's KV events.

BlockStored: full blocks that became findable (their chained hashes, the parent hash of
the first, their token ids); BlockRemoved: hashes no longer findable (evicted, or taken
back when the step that was to write them failed); AllBlocksCleared: the whole cache is
gone (a new executor). Each event is the array vLLM's msgspec structs encode to: the tag
first, then the fields in order (docs/protocol.md, "KV events"). The block pool and the
prefix cache record into one log; the scheduler service drains it once per loop turn.
"""

from __future__ import annotations

from typing import Any

Event = list[Any]


class KVEventLog:
    def __init__(self, block_size: int) -> None:
        self.block_size = block_size
        self._events: list[Event] = []

    def stored(self, hashes: list[bytes], parent: bytes | None, token_ids: list[int]) -> None:
        """Blocks in chain order, each following the one before (token_ids: all of theirs)."""
        # lora_id and medium: no adapters yet, and one medium (the executor's memory).
        self._events.append(["BlockStored", hashes, parent, token_ids, self.block_size,
                             None, None])

    def removed(self, block_hash: bytes) -> None:
        last = self._events[-1] if self._events else None
        if last is not None and last[0] == "BlockRemoved":
            last[1].append(block_hash)   # evictions come in runs: one event per run
        else:
            self._events.append(["BlockRemoved", [block_hash], None])

    def cleared(self) -> None:
        self._events.append(["AllBlocksCleared"])

    def drain(self) -> list[Event]:
        events, self._events = self._events, []
        return events
