"""The frontends as the scheduler process sees them: which connections are live frontends
(their messages and heartbeats), the name each one's hello gave, which request belongs to
which connection, and the routing of each step's outputs to the frontend that owns them.

A frontend that is gone or silent is given up: its requests are aborted (so their blocks
come back) and it is told which, now or at its next hello. Routing ids of connections that
closed are retired: a peer naming one later gets nothing meant for the frontend that had it.

The service owns the frontend socket (a ROUTER with ROUTER_MANDATORY, so a send to a
connection that is gone fails at once) and the Scheduler; `abort` aborts an orphan there."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable

import zmq

from folio.shared.protocol import messages as m
from folio.shared.outputs import EngineOutput, StepOutputs

log = logging.getLogger("folio.scheduler")

FRONTEND_HEARTBEAT_S = 0.5
FRONTEND_TIMEOUT_S = 10.0
FRONTEND_PROBE_S = 0.02   # after a disconnect, look for gone frontends this often
PROBE_WINDOW_S = 0.5      # ... for this long
MAX_DROP_NOTICES = 64     # frontends whose drop notice waits for their next hello
MAX_RETIRED = 4096        # routing ids of dropped frontends, never served again


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
        self.drop_notices: dict[str, list[bytes]] = {}
        # request id -> (frontend routing id, samples still running)
        self.owners: dict[str, tuple[bytes, int]] = {}
        self.last_broadcast = 0.0
        self.probe_until = 0.0

    # ---- who is there -------------------------------------------------------------------

    def heard_from(self, identity: bytes, registers: bool) -> None:
        """A message from this connection: it is alive. One that `registers` (anything but
        a health probe asking for stats) makes it a frontend."""
        if registers or identity in self.frontends:
            self.frontends[identity] = self.clock()

    def on_hello(self, identity: bytes, name: str, info: bytes) -> None:
        self.names[identity] = name
        self.send(identity, info)
        for notice in self.drop_notices.pop(name, []):
            self.send(identity, notice)

    def on_heartbeat(self, sender: bytes, name: str, reply: bytes) -> None:
        """From a frontend's heartbeat thread (its own socket): the frontend that said hello
        under this name is alive, however busy its event loop; the reply tells it that we
        are. (It only keeps a connection registered: outputs go by routing id.)"""
        now = self.clock()
        for identity, known in self.names.items():
            if known == name and identity in self.frontends:
                self.frontends[identity] = now
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
        """Send to a frontend; one that cannot be reached is given up."""
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
                else:
                    owners[base] = (owner[0], owner[1] - 1)
        for request_id, token_id in zip(outputs.ids, outputs.tokens) if columnar else ():
            batch = batch_of(request_id.split("#", 1)[0])[1]
            if batch is not None:
                batch.ids.append(request_id)
                batch.tokens.append(token_id)
        for identity, batch in by_frontend.items():
            self.send(identity, m.encode_outputs(batch))

    # ---- giving up ----------------------------------------------------------------------

    def drop(self, identity: bytes, reason: str, gone: bool = False) -> None:
        """Give up on a frontend connection: abort its requests so their blocks come back,
        and tell the frontend which (on this connection, on its newer one, or at its next
        hello when it cannot be reached now). `gone`: the connection closed, its routing
        id is retired."""
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
        self.drop_notices.setdefault(name, []).extend(notices)

    def is_retired(self, identity: bytes) -> bool:
        return identity in self.retired

    def _retire(self, identity: bytes) -> None:
        """A connection that is gone: its routing id is never served again (a peer that
        names it later cannot pick up what was meant for the frontend that had it)."""
        self.names.pop(identity, None)
        self.retired[identity] = None
        if len(self.retired) > MAX_RETIRED:
            del self.retired[next(iter(self.retired))]
