"""Frontend <-> scheduler messages (docs/protocol.md §5): requests in (`add`, `abort`),
news out (`outputs`, `rejected`, `frontend_dropped`), the engine's capacity (`engine_info`)
and the queries behind health checks (`stats`, `kv_map`; the map is in kv_map_wire.py)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, NamedTuple

from folio.shared.codes import FinishReason, RefusalCode, refusal_code
from folio.shared.config import SchedulingPolicy
from folio.shared.executor_messages import decode_logprob_entry
from folio.shared.outputs import EngineOutput, StepOutputs
from folio.shared.sampling_params import SamplingParams, sampling_from_wire
from folio.shared.wire import MAX_ID_LEN, MAX_TOKEN_ID, Body, ProtocolError, pack


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

    def encode(self) -> bytes:
        return pack("engine_info", {
            "max_model_len": self.max_model_len, "vocab_size": self.vocab_size,
            "num_kv_blocks": self.num_kv_blocks, "block_size": self.block_size,
            "eos_token_ids": list(self.eos_token_ids), "executor_alive": self.executor_alive,
            "max_logprobs": self.max_logprobs, "max_n": self.max_n,
            "executor_ranks": list(self.executor_ranks)})

    @classmethod
    def decode(cls, body: Body) -> "EngineInfo":
        return cls(max_model_len=body.int("max_model_len", 1),
                   vocab_size=body.int("vocab_size", 1),
                   num_kv_blocks=body.int("num_kv_blocks", 1),
                   block_size=body.int("block_size", 1),
                   eos_token_ids=tuple(body.ints("eos_token_ids", 0, MAX_TOKEN_ID, 64)),
                   executor_alive=body.bool("executor_alive", True),
                   max_logprobs=_or_default(body.int("max_logprobs", 0, 1 << 20,
                                                     optional=True), cls.max_logprobs),
                   max_n=_or_default(body.int("max_n", 1, 1 << 20, optional=True), cls.max_n),
                   executor_ranks=tuple(body.ints("executor_ranks", 0, 1 << 31, 1024,
                                                  optional=True)))


def _or_default(value: int | None, default: int) -> int:
    return default if value is None else value


def encode_add(request_id: str, prompt_token_ids: list[int], params: SamplingParams) -> bytes:
    return pack("add", {"id": request_id, "prompt": prompt_token_ids,
                        "params": params.engine_dict()})   # stop strings stay in the frontend


class AddRequest(NamedTuple):
    request_id: str
    prompt_token_ids: list[int]
    params: SamplingParams


def decode_add(body: Body) -> AddRequest:
    return AddRequest(body.str("id"), body.ints("prompt", 0, MAX_TOKEN_ID),
                      sampling_from_wire(body, "params"))


def encode_abort(request_id: str) -> bytes:
    """A frontend's (or an SDK client's: the same shape) abort of one request or sample."""
    return pack("abort", {"id": request_id})


class Abort(NamedTuple):
    request_id: str   # a request id, or one sample of it: "id#i"


def decode_abort(body: Body) -> Abort:
    return Abort(body.str("id"))


def encode_frontend_hello(frontend_id: str) -> bytes:
    return pack("frontend_hello", {"id": frontend_id})


class FrontendHello(NamedTuple):
    frontend_id: str   # fe-<pid>-<6 hex>: the same over reconnections


def decode_frontend_hello(body: Body) -> FrontendHello:
    return FrontendHello(body.str("id"))


def encode_stats_request() -> bytes:
    return pack("stats_request", {})


def encode_kv_map_request() -> bytes:
    return pack("kv_map_request", {})


def encode_rejected(request_id: str, message: str,
                    code: RefusalCode | str = RefusalCode.REJECTED) -> bytes:
    return pack("rejected", {"id": request_id, "message": message[:2000], "code": code})


class Rejected(NamedTuple):
    request_id: str
    code: RefusalCode | str   # a code this build does not know stays a string
    message: str


def decode_rejected(body: Body) -> Rejected:
    return Rejected(body.str("id"), refusal_code(body.str("code", 32)),
                    body.str("message", 4000))


def encode_outputs(outputs: StepOutputs | list[EngineOutput]) -> bytes:
    """Columnar: plain tokens as "i" (request ids) and "t" (one token each), the rest as "o"."""
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
    return pack("outputs", body)


def decode_outputs(body: Body) -> StepOutputs:
    decoded: list[EngineOutput] = []
    queued = body.map("q", optional=True)
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
        seconds = queued.pop(output.request_id, None)   # with the first item of that id
        if isinstance(seconds, (int, float)) and not isinstance(seconds, bool) and seconds >= 0:
            output.queued_s = float(seconds)
        decoded.append(output)
    ids = body.list("i", max_len=1 << 20, optional=True)
    tokens = body.ints("t", 0, MAX_TOKEN_ID, max_len=1 << 20, optional=True)
    if len(ids) != len(tokens) or not all(type(i) is str and len(i) <= MAX_ID_LEN for i in ids):
        raise ProtocolError("outputs: 'i' must be request ids, one per token of 't'")
    return StepOutputs(ids, tokens, decoded)


def _finish_reason(value: str | None) -> FinishReason | None:
    if value is None:
        return None
    try:
        return FinishReason(value)
    except ValueError:
        raise ProtocolError(f"outputs: unknown finish reason {value!r}") from None


def encode_stats(stats: dict[str, Any]) -> bytes:
    return pack("stats", {"stats": stats})


def decode_stats(body: Body) -> dict[str, Any]:
    """The scheduler's counters, passed through unchecked (docs/protocol.md §5)."""
    return body.map("stats")


MAX_DROPPED_IDS = 4096   # request ids per frontend_dropped message


def encode_frontend_dropped(request_ids: list[str], reason: str) -> list[bytes]:
    """The scheduler gave up on a frontend and aborted these requests (in chunks)."""
    return [pack("frontend_dropped", {"ids": request_ids[i:i + MAX_DROPPED_IDS],
                                      "reason": reason[:2000]})
            for i in range(0, len(request_ids), MAX_DROPPED_IDS)]


class FrontendDropped(NamedTuple):
    request_ids: list[str]
    reason: str


def decode_frontend_dropped(body: Body) -> FrontendDropped:
    ids = body.list("ids", MAX_DROPPED_IDS)
    if not all(isinstance(i, str) and len(i) <= 256 for i in ids):
        raise ProtocolError("frontend_dropped: 'ids' must be request ids")
    return FrontendDropped(ids, body.str("reason", 4000))
