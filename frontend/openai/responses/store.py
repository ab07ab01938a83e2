"""The finished responses kept for GET /v1/responses/{id} and previous_response_id: in this
process's memory, at most `size` of them (--responses-store-size), the least recently used
evicted first. A response asked for with store false is never kept. Lost on restart, as
vLLM's in-memory store is: a conversation that must outlive the server sends its history
as `input` instead."""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class Stored:
    response: dict[str, Any]          # the Response object as it was answered
    messages: list[dict[str, Any]]    # its conversation, as chat messages, for the next turn


class ResponseStore:
    def __init__(self, size: int) -> None:
        self.size = size
        self._kept: OrderedDict[str, Stored] = OrderedDict()

    def __len__(self) -> int:
        return len(self._kept)

    def put(self, stored: Stored) -> None:
        if self.size <= 0:
            return
        self._kept[stored.response["id"]] = stored
        self._kept.move_to_end(stored.response["id"])
        while len(self._kept) > self.size:
            self._kept.popitem(last=False)

    def get(self, response_id: str) -> Stored | None:
        stored = self._kept.get(response_id)
        if stored is not None:
            self._kept.move_to_end(response_id)
        return stored

    def delete(self, response_id: str) -> bool:
        return self._kept.pop(response_id, None) is not None
