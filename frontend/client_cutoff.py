"""Clients the ZeroMQ gateway no longer serves: those cut off for not reading their replies
(each with the ids of the requests it must still be told were aborted, once it reads again),
and those that left while messages of theirs were still queued here.

Both bounded: at most `limit` clients each (past that the oldest is forgotten and served as
any client again, until it shows the same fault); a cut-off one is told of at most the
requests it had in flight and `room` more that came while it was cut off.
"""

from __future__ import annotations

import time
from collections.abc import Callable

MAX_CUT_OFF = 1024
MAX_GONE = 4096
GONE_QUIET_S = 1.0   # a gone client's backlog is read without pause; then its id may be reused
CUT_OFF_MIN_S = 1.0  # a cut-off client is not tried before this: a send that went through
                     # may only mean the kernel's buffer took it, not that the client reads


class CutOffClients:
    def __init__(self, limit: int = MAX_CUT_OFF, min_s: float = CUT_OFF_MIN_S,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.limit, self.min_s, self.clock = limit, min_s, clock
        self._notices: dict[bytes, list[str]] = {}   # oldest first
        self._since: dict[bytes, float] = {}
        self._room: dict[bytes, int] = {}   # how many more ids it may be told of

    def __contains__(self, client: bytes) -> bool:
        return client in self._notices

    def __len__(self) -> int:
        return len(self._notices)

    def add(self, client: bytes, aborted: list[str], room: int) -> None:
        """Cut `client` off; it is to be told of `aborted`, and of at most `room` more
        requests of its that are dropped meanwhile."""
        notices = self._notices.pop(client, [])   # cut off again: now the newest
        notices += aborted
        self._notices[client] = notices
        self._since[client] = self.clock()
        self._room[client] = room
        while len(self._notices) > self.limit:
            self.remove(next(iter(self._notices)))

    def dropped(self, client: bytes, client_id: str) -> None:
        """A request of a cut-off client, dropped unread: told of later, while there is room."""
        if self._room[client] > 0:
            self._room[client] -= 1
            self._notices[client].append(client_id)

    def has_room(self, client: bytes) -> bool:
        return self._room[client] > 0

    def may_try(self, client: bytes) -> bool:
        """Whether it has been cut off long enough to be tried again."""
        return self.clock() - self._since[client] >= self.min_s

    def notices(self, client: bytes) -> list[str]:
        """Ids of its requests still to tell it about (the caller pops them)."""
        return self._notices[client]

    def remove(self, client: bytes) -> None:
        self._notices.pop(client, None)
        self._since.pop(client, None)
        self._room.pop(client, None)

    def clients(self) -> list[bytes]:
        return list(self._notices)


class GoneClients:
    """Clients that left: what they sent before leaving is still queued on the socket, and
    each generate in it would start work nobody reads. Their messages are dropped unread,
    until one has sent nothing for `quiet_s` (a peer that sets its own identity may connect
    again under it)."""

    def __init__(self, limit: int = MAX_GONE, quiet_s: float = GONE_QUIET_S,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.limit, self.quiet_s, self.clock = limit, quiet_s, clock
        self._last: dict[bytes, float] = {}   # client -> when it was last heard of

    def __len__(self) -> int:
        return len(self._last)

    def add(self, client: bytes) -> None:
        self._last.pop(client, None)
        self._last[client] = self.clock()
        while len(self._last) > self.limit:
            del self._last[next(iter(self._last))]

    def drops(self, client: bytes) -> bool:
        """Whether this message of `client` is to be dropped (it is from one that left)."""
        last = self._last.get(client)
        if last is None:
            return False
        now = self.clock()
        if now - last > self.quiet_s:
            del self._last[client]
            return False
        self._last[client] = now
        return True
