"""A frontend's side of resuming its requests when its link to the scheduler drops and comes
back (docs/protocol.md §5, "Resuming after a dropped link").

The scheduler numbers the outputs messages it sends this frontend; the frontend reads each
number once (one sent again, or read late off the old connection, is skipped). When the link
drops with requests in flight they are kept, not failed; when it comes back the hello names
the last message read and the requests still waited on, and the scheduler sends again what
was missed, hands the running requests to the new connection and names those it cannot
resume (they fail once). If the link is not back within RESUME_WAIT_S, or the scheduler is
found dead, they fail as before."""

from __future__ import annotations

from folio.shared.protocol import messages as m
from folio.shared.protocol.frontend_scheduler import MAX_RESUME_IDS

RESUME_WAIT_S = 12.0   # the scheduler keeps a parked frontend's requests for 10 s


class LinkResume:
    def __init__(self) -> None:
        self.read_seq = 0                  # the last numbered outputs message read
        self.epoch: str | None = None      # the scheduler run that numbered them
        self.wait_until: float | None = None   # requests kept for a resume until then
        self.asked = False                 # the resuming hello went out

    def fresh(self, seq: int | None) -> bool:
        """Whether an outputs message numbered `seq` is new (read it) or already read."""
        if seq is None:
            return True
        if seq <= self.read_seq:
            return False
        self.read_seq = seq
        return True

    def on_down(self, now: float, in_flight: int) -> bool:
        """The link dropped: keep the requests for a resume (True), or there is nothing to
        keep or too much to name in one hello (False: fail them now)."""
        if not in_flight or in_flight > MAX_RESUME_IDS:
            self.wait_until = None
            return False
        if self.wait_until is None:
            self.wait_until = now + RESUME_WAIT_S
        self.asked = False
        return True

    def hello(self, frontend_id: str, in_flight: list[str]) -> bytes:
        """The hello for a link that came up: resuming when requests are kept."""
        if self.wait_until is None:
            return m.encode_frontend_hello(frontend_id)
        self.asked = True
        return m.encode_frontend_hello(frontend_id, self.read_seq, in_flight)

    def on_info(self, epoch: str) -> bool:
        """engine_info arrived; True when it settles a resume asked for (the scheduler
        answers a hello with what it sends again and names, then engine_info)."""
        if epoch != self.epoch:
            self.epoch, self.read_seq = epoch, 0   # a new scheduler numbers from 1
        if self.asked:
            self.wait_until, self.asked = None, False
            return True
        return False

    def expired(self, now: float) -> bool:
        if self.wait_until is not None and now >= self.wait_until:
            self.wait_until, self.asked = None, False
            return True
        return False
