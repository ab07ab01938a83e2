"""Frontend <-> scheduler messages, each declared once (shared/protocol/schema.py; docs/protocol.md
§5): requests in (`add`, `abort`), news out (`outputs`, `rejected`, `frontend_dropped`), the
engine's capacity (`engine_info`), the queries behind health checks (`stats`, `kv_map`; the
map is in kv_map.py, the counters in stats.py) and the heartbeat that frontends
and executors send and the scheduler answers."""

from __future__ import annotations

from dataclasses import dataclass, field, fields
from typing import Any

from folio.shared.protocol.codes import FinishReason, RefusalCode, refusal_code
from folio.shared.config import SchedulingPolicy
from folio.shared.protocol.scheduler_executor import (LOGPROB_ENTRY, MAX_LORAS, POOLED_VECTOR,
                                                     POOLING_TASK, decode_logprob_entry)
from folio.shared.protocol.links import Link
from folio.shared.outputs import EngineOutput, StepOutputs
from folio.shared.sampling_params import MAX_LORA_NAME_CHARS, SamplingParams
from folio.shared.protocol.schema import (Bool, Code, Field, Float, Int, Ints, Items, ListOf, MapOf,
                                 Message, Sampling, Str)
from folio.shared.protocol.stats import STATS
from folio.shared.protocol.wire import MAX_ID_LEN, MAX_TOKEN_ID, Body, ProtocolError, pack

MAX_DROPPED_IDS = 4096   # request ids per frontend_dropped message
MAX_RESUME_IDS = 1 << 16  # in-flight request ids a resuming frontend names in its hello
MAX_OUTPUT_ITEMS = 1 << 20
MAX_LORA_PATH_CHARS = 4096
_ID = Field("id", Str(), "request_id")


@dataclass
class EngineInfo:
    max_model_len: int
    vocab_size: int
    num_kv_blocks: int
    block_size: int
    eos_token_ids: tuple[int, ...] = field(default_factory=tuple)
    executor_alive: bool = True
    # The scheduler's limits, so frontends check the same ones.
    max_logprobs: int = SchedulingPolicy.max_logprobs
    max_n: int = SchedulingPolicy.max_n
    # Pids of the executor's tensor-parallel ranks, rank 0 first (empty: one process).
    executor_ranks: tuple[int, ...] = ()
    # The LoRA adapters the engine serves now, by name (docs/lora.md).
    loras: tuple[str, ...] = ()
    # The pooling runner's task (shared/pooling/task.py PoolingTask.to_wire); None: generate.
    pooling: dict[str, Any] | None = None
    # This scheduler process's run (random at its start): a frontend that finds it changed
    # knows the outputs' sequence numbers started again.
    epoch: str = ""

    def encode(self) -> bytes:
        return ENGINE_INFO.pack(**{f.name: getattr(self, f.name) for f in fields(self)})

    @classmethod
    def decode(cls, body: Body) -> "EngineInfo":
        return ENGINE_INFO.decode(body)


def _engine_info(values: dict[str, Any]) -> EngineInfo:
    return EngineInfo(**values | {"eos_token_ids": tuple(values["eos_token_ids"]),
                                  "executor_ranks": tuple(values["executor_ranks"]),
                                  "loras": tuple(values["loras"])})


ENGINE_INFO = Message("engine_info", (Link.SCHEDULER_TO_FRONTEND,), (
    Field("max_model_len", Int(1)),
    Field("vocab_size", Int(1)),
    Field("num_kv_blocks", Int(1)),
    Field("block_size", Int(1)),
    Field("eos_token_ids", Ints(0, MAX_TOKEN_ID, 64)),
    Field("executor_alive", Bool(), default=True),
    Field("max_logprobs", Int(0, 1 << 20), default=SchedulingPolicy.max_logprobs),
    Field("max_n", Int(1, 1 << 20), default=SchedulingPolicy.max_n),
    Field("executor_ranks", Ints(0, 1 << 31, 1024), default=()),
    Field("loras", ListOf(Str(MAX_LORA_NAME_CHARS), MAX_LORAS), default=()),
    Field("pooling", POOLING_TASK, default=None),
    Field("epoch", Str(64), default=""),
), value=EngineInfo, build=_engine_info,
   table=True)
assert [f.name for f in fields(EngineInfo)] == [f.name for f in ENGINE_INFO.fields]

MAX_CLIENT_CHARS = 128
ADD = Message("add", (Link.FRONTEND_TO_SCHEDULER,), (
    _ID,
    Field("prompt", Ints(0, MAX_TOKEN_ID), "prompt_token_ids"),
    Field("params", Sampling(engine=True)),   # stop strings stay in the frontend
    # Who sent it, as the frontend tells clients apart (its API key, else its peer): the
    # scheduler's turns between clients (scheduler/fairness/). nil: the anonymous client.
    Field("client", Str(MAX_CLIENT_CHARS), default=None),
), value="AddRequest", table=True)

# A request id, or one sample of it: "id#i". The SDK's abort has the same shape.
ABORT = Message("abort", (Link.CLIENT_TO_GATEWAY, Link.FRONTEND_TO_SCHEDULER), (_ID,),
                value="Abort")

# frontend_id: fe-<pid>-<6 hex>, the same over reconnections. A frontend whose link dropped
# with requests in flight resumes them: `seq` is the last outputs message it read, `ids` the
# requests it still waits on (docs/protocol.md §5, "Resuming after a dropped link").
FRONTEND_HELLO = Message("frontend_hello", (Link.FRONTEND_TO_SCHEDULER,), (
    Field("id", Str(), "frontend_id"),
    Field("seq", Int(0), "resume_seq", default=None),
    Field("ids", ListOf(Str(MAX_ID_LEN), MAX_RESUME_IDS), "resume_ids", default=None),
), value="FrontendHello")
STATS_REQUEST = Message("stats_request", (Link.FRONTEND_TO_SCHEDULER,), ())
KV_MAP_REQUEST = Message("kv_map_request", (Link.FRONTEND_TO_SCHEDULER,), ())


def _heartbeat(values: dict[str, Any]):
    # A frontend's heartbeat thread names its frontend; its pid is not read.
    frontend = values["frontend"]
    return Heartbeat(None, frontend) if frontend is not None else Heartbeat(values["pid"], None)


HEARTBEAT = Message("heartbeat", (Link.FRONTEND_TO_SCHEDULER, Link.EXECUTOR_TO_SCHEDULER,
                                  Link.SCHEDULER_TO_FRONTEND_HEARTBEAT), (
    Field("pid", Int(0)),   # an executor's must be the attached one's
    Field("frontend", Str(), default=None),   # set by a frontend's heartbeat thread
), value="Heartbeat", build=_heartbeat)

REJECTED = Message("rejected", (Link.SCHEDULER_TO_FRONTEND,), (
    _ID,
    Field("message", Str(4000, cut=2000)),
    Field("code", Code(RefusalCode)),   # a code this build does not know stays a string
), value="Rejected", order=("request_id", "code", "message"))

STATS_REPLY = Message("stats", (Link.SCHEDULER_TO_FRONTEND,), (Field("stats", STATS),),
                      build=lambda values: values["stats"])

FRONTEND_DROPPED = Message("frontend_dropped", (Link.SCHEDULER_TO_FRONTEND,), (
    Field("ids", ListOf(Str(MAX_ID_LEN), MAX_DROPPED_IDS), "request_ids"),
    Field("reason", Str(4000, cut=2000)),
), value="FrontendDropped")

# LoRA adapters loaded and unloaded while serving (docs/lora.md): a frontend asks, the
# scheduler passes it on (an unload only once no unfinished request uses the adapter), the
# executor loads or unloads between steps and answers, the scheduler passes the answer back.
# `path`: load the PEFT adapter directory there; nil: unload. `id`: the asker's, echoed.
LORA_UPDATE = Message("lora_update", (Link.FRONTEND_TO_SCHEDULER, Link.SCHEDULER_TO_EXECUTOR), (
    Field("id", Str(), "update_id"),
    Field("name", Str(MAX_LORA_NAME_CHARS)),
    Field("path", Str(MAX_LORA_PATH_CHARS), default=None),
), value="LoraUpdate")
# `error`: why it was not done (nothing changed); nil: done.
LORA_UPDATED = Message("lora_updated", (Link.EXECUTOR_TO_SCHEDULER,
                                        Link.SCHEDULER_TO_FRONTEND), (
    Field("id", Str(), "update_id"),
    Field("name", Str(MAX_LORA_NAME_CHARS)),
    Field("error", Str(4000, cut=2000), default=None),
), value="LoraUpdated")

AddRequest, Abort, FrontendHello = ADD.value, ABORT.value, FRONTEND_HELLO.value
LoraUpdate, LoraUpdated = LORA_UPDATE.value, LORA_UPDATED.value
Heartbeat, Rejected, FrontendDropped = HEARTBEAT.value, REJECTED.value, FRONTEND_DROPPED.value


# ---- the encoders and decoders callers use: each one line over its declaration ----------

def encode_add(request_id: str, prompt_token_ids: list[int], params: SamplingParams,
               client: str | None = None) -> bytes:
    return ADD.pack(request_id=request_id, prompt_token_ids=prompt_token_ids, params=params,
                    client=client)


def encode_abort(request_id: str) -> bytes:
    """A frontend's (or an SDK client's: the same shape) abort of one request or sample."""
    return ABORT.pack(request_id=request_id)


def encode_frontend_hello(frontend_id: str, resume_seq: int | None = None,
                          resume_ids: list[str] | None = None) -> bytes:
    return FRONTEND_HELLO.pack(frontend_id=frontend_id, resume_seq=resume_seq,
                               resume_ids=resume_ids)


def encode_stats_request() -> bytes:
    return STATS_REQUEST.pack()


def encode_kv_map_request() -> bytes:
    return KV_MAP_REQUEST.pack()


def encode_heartbeat(pid: int, frontend: str | None = None) -> bytes:
    return HEARTBEAT.pack(pid=pid, frontend=frontend)


def encode_rejected(request_id: str, message: str,
                    code: RefusalCode | str = RefusalCode.REJECTED) -> bytes:
    return REJECTED.pack(request_id=request_id, message=message, code=code)


def encode_lora_update(update_id: str, name: str, path: str | None) -> bytes:
    return LORA_UPDATE.pack(update_id=update_id, name=name, path=path)


def encode_lora_updated(update_id: str, name: str, error: str | None) -> bytes:
    return LORA_UPDATED.pack(update_id=update_id, name=name, error=error)


decode_lora_update, decode_lora_updated = LORA_UPDATE.decode, LORA_UPDATED.decode


def encode_stats(stats: dict[str, Any]) -> bytes:
    return STATS_REPLY.pack(stats=stats)


def encode_frontend_dropped(request_ids: list[str], reason: str) -> list[bytes]:
    """The scheduler gave up on a frontend and aborted these requests (in chunks)."""
    return [FRONTEND_DROPPED.pack(request_ids=request_ids[i:i + MAX_DROPPED_IDS],
                                  reason=reason)
            for i in range(0, len(request_ids), MAX_DROPPED_IDS)]


decode_add = ADD.decode
decode_abort = ABORT.decode
decode_frontend_hello = FRONTEND_HELLO.decode
decode_heartbeat = HEARTBEAT.decode
decode_rejected = REJECTED.decode
decode_stats = STATS_REPLY.decode   # the counters, checked (stats.py)
decode_frontend_dropped = FRONTEND_DROPPED.decode


# ---- outputs: the per-step hot path, a hand-written columnar codec ----------------------

def encode_outputs(outputs: StepOutputs | list[EngineOutput], seq: int | None = None) -> bytes:
    """Columnar: plain tokens as "i" (request ids) and "t" (one token each), the rest as "o".
    `seq`: this message's number in its frontend's stream (what a resume replays from)."""
    plain = isinstance(outputs, StepOutputs)
    entries = outputs.entries if plain else outputs
    items = []
    for o in entries:
        item = [o.request_id, o.new_token_ids, o.finish_reason, o.error]
        if o.logprobs is not None or o.prompt_logprobs is not None:
            item.append(None if o.logprobs is None else [list(e) for e in o.logprobs])
        if o.prompt_logprobs is not None:
            item.append([list(e) for e in o.prompt_logprobs])
        items.append(item)
    body: dict[str, Any] = {"o": items}
    if plain and outputs.ids:
        body["i"], body["t"] = outputs.ids, outputs.tokens
    queued = {o.request_id: o.queued_s for o in entries if o.queued_s is not None}
    if queued:
        body["q"] = queued
    pooled = {o.request_id: o.pooled for o in entries if o.pooled is not None}
    if pooled:
        body["p"] = pooled
    codes = {o.request_id: o.error_code for o in entries if o.error_code is not None}
    if codes:
        body["ec"] = codes
    if seq is not None:
        body["s"] = seq
    return pack("outputs", body)


def decode_outputs(body: Body) -> StepOutputs:
    decoded: list[EngineOutput] = []
    queued = body.map("q", optional=True)
    pooled = body.map("p", optional=True)
    codes = body.map("ec", optional=True)
    for item in body.list("o", max_len=1 << 20):
        if not isinstance(item, list) or len(item) not in (4, 5, 6):
            raise ProtocolError("outputs: each item must be [id, token ids, finish, error"
                                "(, logprobs(, prompt logprobs))]")
        one = Body("outputs.o", dict(zip(("id", "t", "f", "e", "lp", "plp"), item)))
        reason = _finish_reason(one.str("f", optional=True))
        output = EngineOutput(one.str("id"), one.ints("t", 0, MAX_TOKEN_ID), reason,
                              one.str("e", 4000, optional=True))
        if len(item) >= 5 and item[4] is not None:
            entries = one.list("lp", max_len=1 << 16)
            if len(entries) != len(output.new_token_ids) or None in entries:
                raise ProtocolError("outputs: one logprobs entry per new token")
            output.logprobs = [decode_logprob_entry(e, "outputs.lp") for e in entries]
        if len(item) == 6:
            entries = [decode_logprob_entry(e, "outputs.plp") for e in one.list("plp", 1 << 20)]
            if None in entries:
                raise ProtocolError("outputs: prompt logprobs entries cannot be empty")
            output.prompt_logprobs = entries
        vector = pooled.pop(output.request_id, None)
        if vector is not None:
            output.pooled = POOLED_VECTOR.read(vector, one, "p")
        seconds = queued.pop(output.request_id, None)   # with the first item of that id
        if isinstance(seconds, (int, float)) and not isinstance(seconds, bool) and seconds >= 0:
            output.queued_s = float(seconds)
        code = codes.get(output.request_id) if output.error is not None else None
        if code is not None:   # a code this build does not know stays a string
            if not isinstance(code, str) or len(code) > 64:
                raise ProtocolError("outputs: 'ec' maps request ids to error codes")
            output.error_code = refusal_code(code)
        decoded.append(output)
    ids = body.list("i", max_len=1 << 20, optional=True)
    tokens = body.ints("t", 0, MAX_TOKEN_ID, max_len=1 << 20, optional=True)
    if len(ids) != len(tokens) or not all(type(i) is str and len(i) <= MAX_ID_LEN for i in ids):
        raise ProtocolError("outputs: 'i' must be request ids, one per token of 't'")
    return StepOutputs(ids, tokens, decoded, body.int("s", 0, optional=True))


def _finish_reason(value: str | None) -> FinishReason | None:
    if value is None:
        return None
    try:
        return FinishReason(value)
    except ValueError:
        raise ProtocolError(f"outputs: unknown finish reason {value!r}") from None



OUTPUT_ITEM = Items("outputs.o", (
    Field("id", Str()),
    Field("token ids", Ints(0, MAX_TOKEN_ID)),
    Field("finish reason", Code(FinishReason, strict=True), default=None, send_nil=True),
    Field("error", Str(4000), default=None, send_nil=True),
    Field("logprobs", ListOf(LOGPROB_ENTRY, 1 << 16), default=None, send_nil=True),
    Field("prompt logprobs", ListOf(LOGPROB_ENTRY, MAX_OUTPUT_ITEMS), default=None),
), min_len=4, table=True)

OUTPUTS = Message("outputs", (Link.SCHEDULER_TO_FRONTEND,), (
    Field("o", ListOf(OUTPUT_ITEM, MAX_OUTPUT_ITEMS)),
    Field("i", ListOf(Str(MAX_ID_LEN), MAX_OUTPUT_ITEMS), default=None),
    Field("t", Ints(0, MAX_TOKEN_ID, MAX_OUTPUT_ITEMS), default=None),
    # A value that is not a non-negative number is ignored, not refused.
    Field("q", MapOf(Float(0), 1 << 16), default=None),
    # Pooling requests that ended: request id -> the pooled vector (shared/pooling/vectors.py).
    Field("p", MapOf(POOLED_VECTOR, 1 << 16), default=None),
    # An errored item's code (request_failed: that request alone); absent: engine_dead.
    Field("ec", MapOf(Str(64), 1 << 16), default=None),
    # The message's number in its frontend's stream, from 1; nil from a scheduler that
    # keeps none (then nothing is resumed).
    Field("s", Int(0), default=None),
), codec=(encode_outputs, decode_outputs))

DECLARED = (ENGINE_INFO, ADD, ABORT, FRONTEND_HELLO, STATS_REQUEST, KV_MAP_REQUEST, HEARTBEAT,
            REJECTED, STATS_REPLY, FRONTEND_DROPPED, OUTPUTS, LORA_UPDATE, LORA_UPDATED)
