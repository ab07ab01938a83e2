"""Client (SDK) <-> frontend gateway messages: their encoders, decoders and typed values.

Clients send `generate`, `abort`, `health` and `kv_map`; the frontend answers each
`generate` with `delta`s (streams only), then exactly one `final` or `error`, and each
`health` / `kv_map` with a reply of that type. docs/protocol.md §4 documents them.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, NamedTuple

from folio.shared.catalogue import CLIENT_TO_GATEWAY
from folio.shared.codes import RefusalCode, refusal_code
from folio.shared.sampling_params import SamplingParams, sampling_from_wire
from folio.shared.wire import MAX_TOKEN_ID, MAX_TOKENS_PER_MESSAGE, Body, ProtocolError, pack

CLIENT_TYPES = CLIENT_TO_GATEWAY   # the name the gateway used before the catalogue

MAX_PROMPT_CHARS = 8 * 2**20
MAX_TEXT_CHARS = 64 * 2**20   # a reply's text: bounded by the message size anyway
MAX_MESSAGES = 1024
MAX_DEADLINE_S = 86400.0


@dataclass
class GenerateRequest:
    id: str
    prompt: str | None
    prompt_token_ids: list[int] | None
    messages: list[dict[str, str]] | None
    params: SamplingParams
    stream: bool
    deadline: float | None = None   # seconds; the server aborts the request after that

    @classmethod
    def decode(cls, body: Body) -> "GenerateRequest":
        prompt = body.str("prompt", MAX_PROMPT_CHARS, optional=True)
        token_ids = body.ints("prompt_token_ids", 0, MAX_TOKEN_ID, optional=True) or None
        raw_messages = body.list("messages", MAX_MESSAGES, optional=True) or None
        given = [x is not None for x in (prompt, token_ids, raw_messages)]
        if sum(given) != 1:
            raise ProtocolError("generate: give exactly one of 'prompt', 'prompt_token_ids' "
                                "or 'messages'")
        messages = None
        if raw_messages is not None:
            messages = []
            for item in raw_messages:
                if not isinstance(item, dict):
                    raise ProtocolError("generate: each message must be a map")
                one = Body("generate.messages", item)
                messages.append({"role": one.str("role", 64),
                                 "content": one.str("content", MAX_PROMPT_CHARS)})
        deadline = body.float("deadline", optional=True)
        if deadline is not None and not 0 < deadline <= MAX_DEADLINE_S:
            raise ProtocolError(f"generate: deadline must be in (0, {MAX_DEADLINE_S}] seconds")
        return cls(deadline=deadline, id=body.str("id"), prompt=prompt,
                   prompt_token_ids=token_ids,
                   messages=messages, params=sampling_from_wire(body, "params"),
                   stream=body.bool("stream"))


def encode_generate(request_id: str, params: SamplingParams, stream: bool,
                    prompt: str | None = None, prompt_token_ids: list[int] | None = None,
                    messages: list[dict[str, str]] | None = None,
                    deadline: float | None = None) -> bytes:
    body: dict[str, Any] = {"id": request_id, "params": params.to_dict(), "stream": stream}
    if deadline is not None:
        body["deadline"] = deadline
    if prompt is not None:
        body["prompt"] = prompt
    if prompt_token_ids is not None:
        body["prompt_token_ids"] = list(prompt_token_ids)
    if messages is not None:
        body["messages"] = list(messages)
    return pack("generate", body)


def encode_delta(request_id: str, text: str, token_ids: list[int],
                 logprobs: list[dict[str, Any]] | None = None) -> bytes:
    body: dict[str, Any] = {"id": request_id, "text": text, "token_ids": token_ids}
    if logprobs is not None:
        body["logprobs"] = logprobs
    return pack("delta", body)


def encode_final(request_id: str, text: str, token_ids: list[int], finish_reason: str,
                 prompt_tokens: int, logprobs: list[dict[str, Any]] | None = None,
                 stop_reason: str | None = None,
                 prompt_logprobs: list[dict[str, Any]] | None = None) -> bytes:
    body: dict[str, Any] = {
        "id": request_id, "text": text, "token_ids": token_ids,
        "finish_reason": finish_reason, "stop_reason": stop_reason,
        "usage": {"prompt_tokens": prompt_tokens, "completion_tokens": len(token_ids),
                  "total_tokens": prompt_tokens + len(token_ids)}}
    if logprobs is not None:
        body["logprobs"] = logprobs
    if prompt_logprobs is not None:
        body["prompt_logprobs"] = prompt_logprobs   # from the second prompt token on
    return pack("final", body)


class DeltaReply(NamedTuple):
    request_id: str
    text: str
    token_ids: list[int]
    logprobs: list[dict[str, Any]] | None   # per token, as the frontend's wire_logprob


def decode_delta(body: Body) -> DeltaReply:
    return DeltaReply(body.str("id"), body.str("text", MAX_TEXT_CHARS),
                      body.ints("token_ids", 0, MAX_TOKEN_ID),
                      _optional_list(body, "logprobs"))


class FinalReply(NamedTuple):
    request_id: str
    text: str
    token_ids: list[int]
    finish_reason: str
    stop_reason: str | None
    usage: dict[str, int]   # prompt_tokens, completion_tokens, total_tokens
    logprobs: list[dict[str, Any]] | None
    prompt_logprobs: list[dict[str, Any]] | None   # from the second prompt token on


def decode_final(body: Body) -> FinalReply:
    usage = body.map("usage")
    if not all(isinstance(usage.get(k), int) for k in USAGE_FIELDS):
        raise body.fail("usage", "a map of " + ", ".join(USAGE_FIELDS) + " (integers)")
    return FinalReply(body.str("id"), body.str("text", MAX_TEXT_CHARS),
                      body.ints("token_ids", 0, MAX_TOKEN_ID), body.str("finish_reason", 32),
                      body.str("stop_reason", MAX_TEXT_CHARS, optional=True),
                      {k: usage[k] for k in USAGE_FIELDS}, _optional_list(body, "logprobs"),
                      _optional_list(body, "prompt_logprobs"))


USAGE_FIELDS = ("prompt_tokens", "completion_tokens", "total_tokens")


def _optional_list(body: Body, name: str) -> list[Any] | None:
    return body.list(name, max_len=MAX_TOKENS_PER_MESSAGE) if name in body.body else None


def encode_error(request_id: str, code: RefusalCode | str, message: str) -> bytes:
    return pack("error", {"id": request_id, "code": code, "message": message[:4000]})


class ErrorReply(NamedTuple):
    request_id: str
    code: RefusalCode | str   # a code this build does not know stays a string
    message: str


def decode_error(body: Body) -> ErrorReply:
    return ErrorReply(body.str("id", optional=True) or "",
                      refusal_code(body.str("code", 32, optional=True) or ""),
                      body.str("message", 4000, optional=True) or "")


class ClientQuery(NamedTuple):
    """A client's `abort`, `health` or `kv_map`: the id alone."""

    request_id: str


def decode_client_query(body: Body) -> ClientQuery:
    return ClientQuery(body.str("id"))


def encode_health_query(request_id: str) -> bytes:
    return pack("health", {"id": request_id})


def encode_kv_map_query(request_id: str) -> bytes:
    return pack("kv_map", {"id": request_id})


def encode_health(request_id: str, ok: bool, draining: bool, scheduler: bool, executor: bool,
                  frontend_id: str, stats: dict[str, Any],
                  replicas: list[dict[str, Any]] | None = None) -> bytes:
    """The frontend's `health` reply; `replicas` only with data-parallel replicas."""
    body: dict[str, Any] = {"id": request_id, "ok": ok, "draining": draining,
                            "scheduler": scheduler, "executor": executor,
                            "frontend_id": frontend_id, "stats": stats}
    if replicas is not None:
        body["replicas"] = replicas
    return pack("health", body)


class HealthReply(NamedTuple):
    request_id: str
    ok: bool          # serving: an executor attached and not draining
    draining: bool
    scheduler: bool
    executor: bool
    frontend_id: str
    stats: dict[str, Any]
    replicas: list[dict[str, Any]] | None   # data-parallel replicas only


def decode_health(body: Body) -> HealthReply:
    return HealthReply(body.str("id"), body.bool("ok"), body.bool("draining"),
                       body.bool("scheduler"), body.bool("executor"),
                       body.str("frontend_id", optional=True) or "", body.map("stats"),
                       _optional_list(body, "replicas"))
