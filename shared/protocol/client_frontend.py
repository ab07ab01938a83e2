"""Client (SDK) <-> frontend gateway messages, each declared once (shared/protocol/schema.py).

Clients send `generate`, `abort`, `health` and `kv_map`; the frontend answers each
`generate` with `delta`s (streams only), then exactly one `final` or `error`, and each
`health` / `kv_map` with a reply of that type. docs/protocol.md §4 documents them.
"""

from __future__ import annotations

from dataclasses import dataclass, fields
from typing import Any

from folio.shared.protocol.codes import RefusalCode
from folio.shared.protocol.links import Link
from folio.shared.sampling_params import SamplingParams
from folio.shared.protocol.schema import (Bool, Bytes, Code, Field, Float, Int, Ints, ListOf, Message, Sampling,
                                 Shape, Str)
from folio.shared.protocol.stats import HEALTH_STATS, MAX_REPLICAS
from folio.shared.protocol.wire import MAX_TOKEN_ID, MAX_TOKENS_PER_MESSAGE, Body, ProtocolError

MAX_PROMPT_CHARS = 8 * 2**20
MAX_TEXT_CHARS = 64 * 2**20   # a reply's text: bounded by the message size anyway
MAX_MESSAGES = 1024
MAX_DEADLINE_S = 86400.0
POOLED_ANSWER_BYTES = 4 << 16   # an embedding of up to 65,536 float32s
MAX_N = 2**31 - 1     # as params.n
USAGE_FIELDS = ("prompt_tokens", "completion_tokens", "total_tokens")

_ID = Field("id", Str(), "request_id")
# The frontend's per-token logprobs maps (§4 final), passed to the SDK as they are.
_LOGPROBS = ListOf(max_len=MAX_TOKENS_PER_MESSAGE)


@dataclass
class GenerateRequest:
    id: str
    prompt: str | None
    prompt_token_ids: list[int] | None
    messages: list[dict[str, str]] | None
    params: SamplingParams
    stream: bool
    deadline: float | None = None   # seconds; the server aborts the request after that
    # A pooling request (Client.embed / Client.score; docs/sdk.md): "embed" or "score"; the
    # gateway sets params from the engine's pooling task.
    pooling: str | None = None
    dimensions: int | None = None     # embed: Matryoshka truncation
    text_2: str | None = None         # score: the document scored against `prompt`
    instruction: str | None = None    # score: the reranker prompt's instruction

    @classmethod
    def decode(cls, body: Body) -> "GenerateRequest":
        return GENERATE.decode(body)


def _generate(values: dict[str, Any]) -> GenerateRequest:
    values["prompt_token_ids"] = values["prompt_token_ids"] or None   # [] counts as absent
    values["messages"] = values["messages"] or None
    if sum(values[k] is not None for k in ("prompt", "prompt_token_ids", "messages")) != 1:
        raise ProtocolError("generate: give exactly one of 'prompt', 'prompt_token_ids' "
                            "or 'messages'")
    pooling = values["pooling"]
    if pooling not in (None, "embed", "score"):
        raise ProtocolError(f"generate: pooling must be embed or score, got {pooling!r:.20}")
    if (pooling == "score") != (values["text_2"] is not None) or (
            pooling == "score" and values["prompt"] is None) or (
            pooling is not None and values["messages"] is not None):
        raise ProtocolError("generate: a score takes 'prompt' and 'text_2', an embed a "
                            "prompt or prompt ids; neither takes messages")
    return GenerateRequest(**values)


GENERATE = Message("generate", (Link.CLIENT_TO_GATEWAY,), (
    Field("id", Str()),
    Field("params", Sampling()),
    Field("stream", Bool(), default=False),
    Field("deadline", Float(0, MAX_DEADLINE_S, low_open=True), default=None),
    Field("prompt", Str(MAX_PROMPT_CHARS), default=None),
    Field("prompt_token_ids", Ints(0, MAX_TOKEN_ID), default=None),
    Field("messages", ListOf(Shape("generate.messages", (
        Field("role", Str(64)), Field("content", Str(MAX_PROMPT_CHARS))), table=False),
        MAX_MESSAGES),
        default=None),
    Field("pooling", Str(8), default=None),
    Field("dimensions", Int(1, 1 << 16), default=None),
    Field("text_2", Str(MAX_PROMPT_CHARS), default=None),
    Field("instruction", Str(MAX_PROMPT_CHARS), default=None),
), value=GenerateRequest, build=_generate, table=True)

DELTA = Message("delta", (Link.GATEWAY_TO_CLIENT,), (
    _ID,
    Field("text", Str(MAX_TEXT_CHARS)),
    Field("token_ids", Ints(0, MAX_TOKEN_ID)),
    Field("logprobs", _LOGPROBS, default=None),
    Field("index", Int(0, MAX_N), default=0),   # which of the request's n samples
), value="DeltaReply", table=True)

# Each of a request's n samples, in `final.samples` (n > 1 only).
SAMPLE = Shape("final.samples", (
    Field("index", Int(0, MAX_N)),
    Field("text", Str(MAX_TEXT_CHARS)),
    Field("token_ids", Ints(0, MAX_TOKEN_ID)),
    Field("finish_reason", Str(32)),
    Field("stop_reason", Str(MAX_TEXT_CHARS), default=None, send_nil=True),
    Field("logprobs", _LOGPROBS, default=None),
), table=True)
USAGE = Shape("final.usage", tuple(Field(k, Int()) for k in USAGE_FIELDS), table=False)
FINAL = Message("final", (Link.GATEWAY_TO_CLIENT,), (
    _ID,
    Field("text", Str(MAX_TEXT_CHARS)),
    Field("token_ids", Ints(0, MAX_TOKEN_ID)),
    Field("finish_reason", Str(32)),
    Field("stop_reason", Str(MAX_TEXT_CHARS), default=None, send_nil=True),
    Field("usage", USAGE),
    Field("logprobs", _LOGPROBS, default=None),
    Field("prompt_logprobs", _LOGPROBS, default=None),   # from the second prompt token on
    # A pooling request's answer, little-endian float32s: the embedding (truncated and
    # normalised as the model says) or the one score.
    Field("pooled", Bytes(POOLED_ANSWER_BYTES), default=None),
    # n > 1: every sample, by index (the top-level fields repeat sample 0's)
    Field("samples", ListOf(SAMPLE, MAX_TOKENS_PER_MESSAGE), default=None),
), value="FinalReply", table=True)

ERROR = Message("error", (Link.GATEWAY_TO_CLIENT,), (
    Field("id", Str(), "request_id", default=""),
    Field("code", Code(RefusalCode), default=""),   # a code this build does not know: a str
    Field("message", Str(4000, cut=4000), default=""),
), value="ErrorReply", table=True)

# A client's `abort`, `health` or `kv_map`: the id alone.
HEALTH_QUERY = Message("health", (Link.CLIENT_TO_GATEWAY,), (_ID,), value="ClientQuery",
                       doc_name="health query")
KV_MAP_QUERY = Message("kv_map", (Link.CLIENT_TO_GATEWAY,), (_ID,), value=HEALTH_QUERY.value,
                       doc_name="kv_map query")

RANK = Shape("health.replicas.ranks", (
    Field("rank", Int(0, 1 << 16)), Field("pid", Int(0)), Field("status", Str(32))),
    table=False)
REPLICA = Shape("health.replicas", (
    Field("replica", Int(0, MAX_REPLICAS)),
    Field("address", Str(4096), default=None),
    Field("status", Str(32), default=None),
    Field("reason", Str(4000), default=None),
    Field("in_flight", Int(0), default=None),
    Field("routed", Int(0), default=None),
    Field("ranks", ListOf(RANK, 1 << 16), default=None),
), table=False)
HEALTH = Message("health", (Link.GATEWAY_TO_CLIENT,), (
    _ID,
    Field("ok", Bool(), default=False),   # serving: an executor attached and not draining
    Field("draining", Bool(), default=False),
    Field("scheduler", Bool(), default=False),
    Field("executor", Bool(), default=False),
    Field("frontend_id", Str(), default=""),
    Field("stats", HEALTH_STATS, rule="`stats.stats` (§5); with data-parallel replicas also "
                                      "`replicas`: per replica `replica` (int) and its "
                                      "own `stats.stats`"),
    Field("replicas", ListOf(REPLICA, MAX_REPLICAS), default=None),   # data-parallel only
), value="HealthReply", table=True)

DeltaReply, FinalReply, ErrorReply = DELTA.value, FINAL.value, ERROR.value
ClientQuery, HealthReply = HEALTH_QUERY.value, HEALTH.value
DECLARED = (GENERATE, DELTA, FINAL, ERROR, HEALTH_QUERY, KV_MAP_QUERY, HEALTH)
assert {f.name for f in fields(GenerateRequest)} == {f.name for f in GENERATE.fields}


# ---- the encoders and decoders callers use: each one line over its declaration ----------

def encode_generate(request_id: str, params: SamplingParams, stream: bool,
                    prompt: str | None = None, prompt_token_ids: list[int] | None = None,
                    messages: list[dict[str, str]] | None = None,
                    deadline: float | None = None, pooling: str | None = None,
                    dimensions: int | None = None, text_2: str | None = None,
                    instruction: str | None = None) -> bytes:
    return GENERATE.pack(id=request_id, params=params, stream=stream, deadline=deadline,
                         prompt=prompt, prompt_token_ids=prompt_token_ids, messages=messages,
                         pooling=pooling, dimensions=dimensions, text_2=text_2,
                         instruction=instruction)


def encode_delta(request_id: str, text: str, token_ids: list[int],
                 logprobs: list[dict[str, Any]] | None = None, index: int = 0) -> bytes:
    return DELTA.pack(request_id=request_id, text=text, token_ids=token_ids,
                      logprobs=logprobs, index=index or None)   # 0: left out


def encode_final(request_id: str, text: str, token_ids: list[int], finish_reason: str,
                 prompt_tokens: int, logprobs: list[dict[str, Any]] | None = None,
                 stop_reason: str | None = None,
                 prompt_logprobs: list[dict[str, Any]] | None = None,
                 pooled: bytes | None = None,
                 samples: list[dict[str, Any]] | None = None) -> bytes:
    """The top-level text, token_ids, reasons and logprobs are sample 0's; `samples` (n > 1
    only) lists every sample as a map of SAMPLE's keys, and usage counts all of them."""
    generated = len(token_ids) if samples is None else sum(len(s["token_ids"]) for s in samples)
    usage = {"prompt_tokens": prompt_tokens, "completion_tokens": generated,
             "total_tokens": prompt_tokens + generated}
    return FINAL.pack(request_id=request_id, text=text, token_ids=token_ids,
                      finish_reason=finish_reason, stop_reason=stop_reason, usage=usage,
                      logprobs=logprobs, prompt_logprobs=prompt_logprobs, pooled=pooled,
                      samples=samples)


def encode_error(request_id: str, code: RefusalCode | str, message: str) -> bytes:
    return ERROR.pack(request_id=request_id, code=code, message=message)


def encode_health_query(request_id: str) -> bytes:
    return HEALTH_QUERY.pack(request_id=request_id)


def encode_kv_map_query(request_id: str) -> bytes:
    return KV_MAP_QUERY.pack(request_id=request_id)


def encode_health(request_id: str, ok: bool, draining: bool, scheduler: bool, executor: bool,
                  frontend_id: str, stats: dict[str, Any],
                  replicas: list[dict[str, Any]] | None = None) -> bytes:
    """The frontend's `health` reply; `replicas` only with data-parallel replicas."""
    return HEALTH.pack(request_id=request_id, ok=ok, draining=draining, scheduler=scheduler,
                       executor=executor, frontend_id=frontend_id, stats=stats,
                       replicas=replicas)


decode_delta = DELTA.decode
decode_final = FINAL.decode
decode_error = ERROR.decode
decode_client_query = HEALTH_QUERY.decode   # abort, health and kv_map: {id}
decode_health = HEALTH.decode
