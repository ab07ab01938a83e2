"""The frontends as the scheduler process sees them: which connections are live frontends
(their messages and heartbeats), the name each one's hello gave, which request belongs to
which connection, and the routing of each step's outputs to the frontend that owns them.

A frontend that is silent is given up: its requests are aborted (so their blocks come back)
and it is told which, now or at its next hello. A frontend whose connection closed while its
process lives (its heartbeat thread still beats) is parked instead: its requests run on,
their outputs are kept (frontend_replay.py), and its next hello, naming the last message it
read, picks them up where it left off. One whose heartbeat also stops, or that does not come
back within RESUME_WINDOW_S, is given up. Routing ids of connections that closed are retired:
a peer naming one later gets nothing meant for the frontend that had it.

The service owns the frontend socket (a ROUTER with ROUTER_MANDATORY, so a send to a
connection that is gone fails at once) and the Scheduler; `abort` aborts an orphan there."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable

import zmq

from folio.scheduler.frontend_replay import OutputReplay
from folio.shared.protocol import messages as m
from folio.shared.outputs import EngineOutput, StepOutputs

log = logging.getLogger("folio.scheduler")

FRONTEND_HEARTBEAT_S = 0.5
FRONTEND_TIMEOUT_S = 10.0
FRONTEND_PROBE_S = 0.02   # after a disconnect, look for gone frontends this often
PROBE_WINDOW_S = 0.5      # ... for this long
MAX_DROP_NOTICES = 64     # frontends whose drop notice waits for their next hello
MAX_RETIRED = 4096        # routing ids of dropped frontends, never served again
RESUME_WINDOW_S = 10.0    # a parked frontend's requests wait this long for its hello
PARKED_SILENT_S = 2.0     # ... unless its heartbeat stops this long (its process is gone)


def base_id(request_id: str) -> str:
    """The request id a frontend added: samples of n > 1 report as "id#i"."""
    return request_id.split("#", 1)[0]


class FrontendRouter:
    def __init__(self, sock: zmq.Socket, abort: Callable[[str], None],
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.sock = sock
        self.abort = abort
        self.clock = clock
        self.frontends: dict[bytes, float] = {}   # routing id -> last message time
        self.names: dict[bytes, str] = {}         # routing id -> the name its hello gave
        self.retired: dict[bytes, None] = {}      # routing ids given up on (oldest first)
        # frontend name -> frontend_dropped messages it could not be sent yet
        self.drop_notices: dict[str, list[tuple[list[str], str]]] = {}   # (ids, reason)
        # request id -> (frontend routing id, samples still running)
        self.owners: dict[str, tuple[bytes, int]] = {}
        self.last_broadcast = 0.0
        self.probe_until = 0.0
        self.replay = OutputReplay(clock)
        # routing id of a closed connection whose frontend may resume -> (parked at, last
        # heartbeat of its frontend)
        self.parked: dict[bytes, tuple[float, float]] = {}

    # ---- who is there -------------------------------------------------------------------

    def heard_from(self, identity: bytes, registers: bool) -> None:
        """A message from this connection: it is alive. One that `registers` (anything but
        a health probe asking for stats) makes it a frontend."""
        if identity in self.parked:
            return   # a message that was queued before its connection closed
        if registers or identity in self.frontends:
            self.frontends[identity] = self.clock()

    def on_hello(self, identity: bytes, name: str, info: bytes,
                 resume_seq: int | None = None, resume_ids: list[str] | None = None) -> None:
        """A frontend (re)connects. Its earlier connections' requests are handed to this one
        (when it resumes and what it missed is kept: sent again first), or given up."""
        earlier = [other for other, known in self.names.items()
                   if known == name and other != identity]
        self.names[identity] = name
        if resume_seq is not None and resume_ids is not None:
            self._resume(identity, name, earlier, resume_seq, resume_ids)
        else:
            for other in earlier:
                self._give_up(other, "it connected afresh without resuming", gone=True)
        self.send(identity, info)
        for request_ids, reason in self.drop_notices.pop(name, []):
            self._notify(identity, request_ids, reason)

    def _resume(self, identity: bytes, name: str, earlier: list[bytes], seq: int,
                ids: list[str]) -> None:
        # Requests given up while it was away: named with the reason they were given up.
        for request_ids, reason in self.drop_notices.pop(name, []):
            self._notify(identity, request_ids, reason)
            named = set(request_ids)
            ids = [rid for rid in ids if rid not in named]
        kept = self.replay.since(name, seq)
        wanted = set(ids)
        if kept is None:
            reason = ("its outputs since the link dropped were no longer kept, so the "
                      "request cannot resume exactly; retry it")
            unknown = [rid for rid in ids if rid not in self.owners]
            for other in earlier:   # tells the frontend which of its requests it aborted
                self._give_up(other, reason, gone=True)
            self._notify(identity, unknown, reason)
            return
        missed, ended = kept
        moved = forgotten = 0
        for request_id, (owner, samples) in list(self.owners.items()):
            if owner not in earlier:
                continue
            if request_id in wanted:
                self.owners[request_id] = (identity, samples)
                moved += 1
            else:   # the frontend ended it meanwhile (its abort was lost with the link)
                del self.owners[request_id]
                self.abort(request_id)
                forgotten += 1
        for other in earlier:
            self.frontends.pop(other, None)
            self.parked.pop(other, None)
            self._retire(other)
        for payload in missed:
            self.send(identity, payload)
        unknown = [rid for rid in ids if rid not in self.owners and rid not in ended]
        if moved or unknown or forgotten:
            log.info("frontend %r resumed %d request(s) (%d message(s) sent again, %d it "
                     "no longer wanted aborted, %d unknown)", name, moved, len(missed),
                     forgotten, len(unknown))
        # Unknown: it never arrived (lost with the link), was refused, or ended before the
        # messages kept; the frontend fails those it still waits on, once.
        self._notify(identity, unknown, "the request was lost with the link to the scheduler "
                     "(it did not arrive, or its end was not kept); retry it")

    def _notify(self, identity: bytes, request_ids: list[str], reason: str) -> None:
        if request_ids:
            for notice in m.encode_frontend_dropped(request_ids, reason):
                self.send(identity, notice)

    def on_heartbeat(self, sender: bytes, name: str, reply: bytes) -> None:
        """From a frontend's heartbeat thread (its own socket): the frontend that said hello
        under this name is alive, however busy its event loop; the reply tells it that we
        are. (It only keeps a connection registered: outputs go by routing id.)"""
        now = self.clock()
        for identity, known in self.names.items():
            if known == name and identity in self.frontends:
                self.frontends[identity] = now
            elif known == name and identity in self.parked:
                self.parked[identity] = (self.parked[identity][0], now)
        try:
            self.sock.send_multipart([sender, reply], zmq.NOBLOCK)
        except zmq.ZMQError:
            pass   # that socket is gone; its frontend's own link decides

    def on_peer_disconnected(self) -> None:
        """Some peer of the socket left: look for gone frontends often for a moment."""
        self.probe_until = self.clock() + PROBE_WINDOW_S

    def heartbeat(self, info: Callable[[], bytes]) -> None:
        """engine_info to every frontend each FRONTEND_HEARTBEAT_S, and more often for a
        moment after a peer of the socket disconnected: a send to a connection that is gone
        fails at once, so a dead frontend is given up in milliseconds. A frontend silent
        for FRONTEND_TIMEOUT_S is given up too."""
        now = self.clock()
        probing = now < self.probe_until
        if now - self.last_broadcast < (FRONTEND_PROBE_S if probing else FRONTEND_HEARTBEAT_S):
            return
        if probing:   # process pending pipe terminations first (as the executor probe does)
            self.sock.getsockopt(zmq.EVENTS)
        self.last_broadcast = now
        for identity, (parked_at, heard) in list(self.parked.items()):
            if now - heard > PARKED_SILENT_S:
                self._give_up(identity, "its connection closed and its heartbeat stopped",
                              gone=True)
            elif now - parked_at > RESUME_WINDOW_S:
                self._give_up(identity, f"its connection closed and it did not resume "
                              f"within {RESUME_WINDOW_S:.0f} s", gone=True)
        payload = info()
        for identity, seen in list(self.frontends.items()):
            if now - seen > FRONTEND_TIMEOUT_S:
                self.drop(identity, f"no heartbeat from it for {FRONTEND_TIMEOUT_S:.0f} s")
            else:
                self.send(identity, payload)

    def broadcast(self, payload: bytes) -> None:
        for identity in list(self.frontends):
            self.send(identity, payload)

    # ---- whose request is it ------------------------------------------------------------

    def claim(self, request_id: str, identity: bytes, num_samples: int) -> None:
        self.owners[request_id] = (identity, num_samples)

    def in_use(self, request_id: str) -> bool:
        return request_id in self.owners

    def owns(self, identity: bytes, request_id: str) -> bool:
        """Whether this connection owns the request (or the request one sample is of)."""
        owner = self.owners.get(base_id(request_id))
        return owner is not None and owner[0] == identity

    @property
    def num_requests(self) -> int:
        return len(self.owners)

    def request_ids(self) -> list[str]:
        return list(self.owners)

    # ---- sending ------------------------------------------------------------------------

    def send(self, identity: bytes, payload: bytes) -> None:
        """Send to a frontend; one that cannot be reached is given up (or parked)."""
        if identity in self.parked:
            return   # outputs are kept for its resume; anything else it asks again
        try:
            self.sock.send_multipart([identity, payload], zmq.NOBLOCK)
        except zmq.ZMQError as error:
            gone = error.errno == zmq.EHOSTUNREACH
            self.drop(identity, "its connection closed" if gone else
                      "a message to it could not be delivered: its queue is full", gone)

    def route(self, outputs: StepOutputs | list[EngineOutput]) -> None:
        """Each frontend gets one columnar `outputs` message with its own requests' news;
        a request whose last sample finished is no longer owned."""
        columnar = isinstance(outputs, StepOutputs)
        by_frontend: dict[bytes, StepOutputs] = {}
        ended: dict[bytes, list[str]] = {}   # requests whose last sample ended, by frontend
        owners = self.owners

        def batch_of(base: str):
            owner = owners.get(base)
            if owner is None:
                return None, None
            batch = by_frontend.get(owner[0])
            if batch is None:
                batch = by_frontend[owner[0]] = StepOutputs()
            return owner, batch

        # base_id inlined: this runs for every token of every step.
        for output in outputs.entries if columnar else outputs:
            base = output.request_id.split("#", 1)[0]
            owner, batch = batch_of(base)
            if batch is None:
                continue
            batch.entries.append(output)
            if output.finished:
                if owner[1] == 1:
                    del owners[base]
                    ended.setdefault(owner[0], []).append(base)
                else:
                    owners[base] = (owner[0], owner[1] - 1)
        for request_id, token_id in zip(outputs.ids, outputs.tokens) if columnar else ():
            batch = batch_of(request_id.split("#", 1)[0])[1]
            if batch is not None:
                batch.ids.append(request_id)
                batch.tokens.append(token_id)
        for identity, batch in by_frontend.items():
            name = self.names.get(identity)
            if name is None:   # never said hello: nothing to resume
                self.send(identity, m.encode_outputs(batch))
                continue
            seq = self.replay.next_seq(name)
            payload = m.encode_outputs(batch, seq)
            self.replay.keep(name, seq, payload, tuple(ended.get(identity, ())))
            self.send(identity, payload)

    # ---- giving up ----------------------------------------------------------------------

    def drop(self, identity: bytes, reason: str, gone: bool = False) -> None:
        """A frontend connection closed (`gone`) or cannot take messages: park it when its
        frontend may resume (it said hello and has requests here), else give it up."""
        if identity in self.parked:
            return
        if gone and identity in self.names and any(
                owner == identity for owner, _ in self.owners.values()):
            self.frontends.pop(identity, None)
            now = self.clock()
            self.parked[identity] = (now, now)
            log.warning("frontend %r's connection closed (%s): its requests run on for %.0f s "
                        "for it to resume", self.names[identity], reason, RESUME_WINDOW_S)
            return
        self._give_up(identity, reason, gone)

    def _give_up(self, identity: bytes, reason: str, gone: bool = False) -> None:
        """Give up on a frontend connection: abort its requests so their blocks come back,
        and tell the frontend which (on this connection, on its newer one, or at its next
        hello when it cannot be reached now). `gone`: the connection closed, its routing
        id is retired."""
        self.parked.pop(identity, None)
        self.frontends.pop(identity, None)
        name = self.names.get(identity)
        if gone:
            self._retire(identity)
        orphans = [rid for rid, owner in self.owners.items() if owner[0] == identity]
        for request_id in orphans:
            del self.owners[request_id]
            self.abort(request_id)
        if not orphans:
            return
        log.warning("gave up on frontend %r (%s): aborted its %d request(s)", identity, reason,
                    len(orphans))
        notices = m.encode_frontend_dropped(orphans, reason)
        targets = [] if gone else [identity]
        targets += [other for other, other_name in self.names.items()
                    if other_name == name and other != identity and other in self.frontends]
        for target in targets:
            try:
                for notice in notices:
                    self.sock.send_multipart([target, notice], zmq.NOBLOCK)
                return
            except zmq.ZMQError:
                continue
        if name is None:
            return   # it never said hello: nobody to tell
        if len(self.drop_notices) >= MAX_DROP_NOTICES and name not in self.drop_notices:
            del self.drop_notices[next(iter(self.drop_notices))]   # the oldest
        self.drop_notices.setdefault(name, []).append((orphans, reason))

    def is_retired(self, identity: bytes) -> bool:
        return identity in self.retired

    def _retire(self, identity: bytes) -> None:
        """A connection that is gone: its routing id is never served again (a peer that
        names it later cannot pick up what was meant for the frontend that had it)."""
        self.names.pop(identity, None)
        self.retired[identity] = None
        if len(self.retired) > MAX_RETIRED:
            del self.retired[next(iter(self.retired))]
