"""Every message type, and which types each link accepts: derived from the declarations.

Each message is declared once (shared/protocol/client_frontend.py, frontend_scheduler.py,
scheduler_executor.py, kv_map.py) with the links that carry it; this module gathers
them. A receiver passes its link's set to `shared.messages.decode`, which refuses any other
type. docs/protocol.md §2 has the same table; tests/shared/protocol/test_doc.py checks it.
"""

from __future__ import annotations

from enum import StrEnum

from folio.shared.protocol import client_frontend, frontend_scheduler, kv_map, scheduler_executor
from folio.shared.protocol.links import Link
from folio.shared.protocol.schema import Message

DECLARATIONS: tuple[Message, ...] = (*client_frontend.DECLARED, *frontend_scheduler.DECLARED,
                                     *scheduler_executor.DECLARED, *kv_map.DECLARED)

# A type code may have one declaration per direction (`health`: the query and the reply).
MessageType = StrEnum("MessageType", {d.type.upper(): d.type for d in DECLARATIONS})


def types_on(link: Link) -> frozenset[str]:
    return frozenset(MessageType(d.type) for d in DECLARATIONS if link in d.links)


def declaration(msg_type: str, link: Link) -> Message:
    """The declaration of `msg_type` as `link` carries it."""
    (found,) = (d for d in DECLARATIONS if d.type == msg_type and link in d.links)
    return found


CLIENT_TO_GATEWAY = types_on(Link.CLIENT_TO_GATEWAY)
GATEWAY_TO_CLIENT = types_on(Link.GATEWAY_TO_CLIENT)
FRONTEND_TO_SCHEDULER = types_on(Link.FRONTEND_TO_SCHEDULER)
SCHEDULER_TO_FRONTEND = types_on(Link.SCHEDULER_TO_FRONTEND)
SCHEDULER_TO_FRONTEND_HEARTBEAT = types_on(Link.SCHEDULER_TO_FRONTEND_HEARTBEAT)
EXECUTOR_TO_SCHEDULER = types_on(Link.EXECUTOR_TO_SCHEDULER)
SCHEDULER_TO_EXECUTOR = types_on(Link.SCHEDULER_TO_EXECUTOR)
RANK0_TO_RANKS = types_on(Link.RANK0_TO_RANKS)

LINKS = tuple((link.value, types_on(link)) for link in Link)
ALL_TYPES = frozenset(MessageType)
