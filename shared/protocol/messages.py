"""The message catalogue: every message that crosses a socket, its encoder and decoder.

docs/protocol.md documents each one. Each message is declared once, with its fields, their
bounds and the links that carry it (shared/protocol/schema.py is the vocabulary), in a module per
link: client_frontend.py, frontend_scheduler.py, scheduler_executor.py, kv_map.py (the
counters of `stats` in stats.py). Their encoders and decoders come from those
declarations; catalogue.py gathers the types per link. This module re-exports them all, so
callers use `from folio.shared.protocol import messages as m`. Bodies are msgpack maps with short
keys on the per-step hot path (plan, result, outputs), whose codecs are hand-written.
Decoders return typed values (NamedTuples where callers unpack them, dataclasses else).
"""

from __future__ import annotations

from folio.shared.protocol.catalogue import (ALL_TYPES, CLIENT_TO_GATEWAY, DECLARATIONS,  # noqa: F401
                                    EXECUTOR_TO_SCHEDULER, FRONTEND_TO_SCHEDULER,
                                    GATEWAY_TO_CLIENT, LINKS, RANK0_TO_RANKS,
                                    SCHEDULER_TO_EXECUTOR, SCHEDULER_TO_FRONTEND,
                                    SCHEDULER_TO_FRONTEND_HEARTBEAT, MessageType)
from folio.shared.protocol.client_frontend import (MAX_DEADLINE_S, MAX_MESSAGES,  # noqa: F401
                                          MAX_PROMPT_CHARS, ClientQuery, DeltaReply,
                                          ErrorReply, FinalReply, GenerateRequest, HealthReply,
                                          decode_client_query, decode_delta, decode_error,
                                          decode_final, decode_health, encode_delta,
                                          encode_error, encode_final, encode_generate,
                                          encode_health, encode_health_query,
                                          encode_kv_map_query)
from folio.shared.protocol.codes import FinishReason, RefusalCode, refusal_code  # noqa: F401
from folio.shared.protocol.scheduler_executor import (ExecutorError, ExecutorHello,  # noqa: F401
                                            decode_executor_error, decode_hello_executor,
                                            decode_logprob_entry, decode_plan, decode_result,
                                            encode_executor_error, encode_hello_executor,
                                            encode_ping, encode_plan, encode_reset,
                                            encode_result)
from folio.shared.protocol.kv_map import (KV_MAP_STATES, MAX_KV_MAP_BLOCKS,  # noqa: F401
                                      MAX_KV_MAP_REQUESTS, decode_kv_map, encode_kv_map)
from folio.shared.sampling_params import sampling_from_wire  # noqa: F401
from folio.shared.protocol.frontend_scheduler import (LoraUpdate, LoraUpdated,  # noqa: F401
                                             decode_lora_update, decode_lora_updated,
                                             encode_lora_update, encode_lora_updated)
from folio.shared.protocol.frontend_scheduler import (MAX_DROPPED_IDS, Abort, AddRequest,  # noqa: F401
                                             EngineInfo, FrontendDropped, FrontendHello,
                                             Heartbeat, Rejected, decode_abort, decode_add,
                                             decode_frontend_dropped, decode_frontend_hello,
                                             decode_heartbeat, decode_outputs,
                                             decode_rejected, decode_stats, encode_abort,
                                             encode_add, encode_frontend_dropped,
                                             encode_frontend_hello, encode_heartbeat,
                                             encode_kv_map_request, encode_outputs,
                                             encode_rejected, encode_stats,
                                             encode_stats_request)
from folio.shared.protocol.wire import (MAX_BLOCK_ID, MAX_ID_LEN, MAX_TOKEN_ID, Body,  # noqa: F401
                               ProtocolError, pack, unpack)

CLIENT_TYPES = CLIENT_TO_GATEWAY   # the name the gateway used before the catalogue

FINISH_REASONS = tuple(FinishReason)   # the name used before the enum


def decode(data: bytes, allowed: frozenset[str]) -> tuple[str, Body]:
    """Unpack a message and refuse a type outside `allowed` (a link's set, catalogue.py)."""
    msg_type, body = unpack(data)
    if msg_type not in allowed:
        raise ProtocolError(f"unexpected message type {msg_type!r} on this socket")
    return msg_type, Body(msg_type, body)


def peek_id(data: bytes) -> str:
    """The "id" field of a message that failed validation, if it has a readable one."""
    try:
        _, body = unpack(data)
    except ProtocolError:
        return ""
    value = body.get("id", "")
    return value if isinstance(value, str) and 0 < len(value) <= MAX_ID_LEN else ""

