"""The message catalogue: every message that crosses a socket, its encoder and decoder.

docs/protocol.md documents each one. Types are short strings; bodies are msgpack maps with
short keys on the per-step hot path (plan, result, outputs).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from shared.config import ExecutorCapacity, SchedulingPolicy
from shared.outputs import EngineOutput, StepOutputs
from shared.sampling_params import SamplingParams
from shared.step import NewRequest, StepPlan, StepResult
from shared.wire import MAX_ID_LEN, Body, ProtocolError, pack, unpack

MAX_BLOCK_ID = 2**31 - 1
MAX_TOKEN_ID = 2**31 - 1
FINISH_REASONS = ("stop", "length", "abort", "error")


def sampling_from_wire(body: Body, name: str = "params") -> SamplingParams:
    raw = body.map(name)
    try:
        return SamplingParams.from_dict(raw)
    except (TypeError, ValueError) as error:
        raise ProtocolError(f"{body.msg_type}: {error}") from None


# ---- scheduler <-> executor --------------------------------------------------------------

def encode_hello_executor(capacity: ExecutorCapacity, pid: int) -> bytes:
    return pack("executor_hello", {
        "num_kv_blocks": capacity.num_kv_blocks, "block_size": capacity.block_size,
        "max_model_len": capacity.max_model_len, "vocab_size": capacity.vocab_size,
        "eos_token_ids": list(capacity.eos_token_ids), "pid": pid,
        "num_swap_blocks": capacity.num_swap_blocks, "bytes_per_block": capacity.bytes_per_block,
        "prefill_tokens_per_s": capacity.prefill_tokens_per_s,
        "swap_bytes_per_s": capacity.swap_bytes_per_s,
        "sliding_window": capacity.sliding_window or 0, "rewrites_kv": capacity.rewrites_kv})


def decode_hello_executor(body: Body) -> tuple[ExecutorCapacity, int]:
    capacity = ExecutorCapacity(
        num_kv_blocks=body.int("num_kv_blocks", 1, MAX_BLOCK_ID),
        block_size=body.int("block_size", 1, 1 << 16),
        max_model_len=body.int("max_model_len", 1, 1 << 30),
        vocab_size=body.int("vocab_size", 1, MAX_TOKEN_ID),
        eos_token_ids=tuple(body.ints("eos_token_ids", 0, MAX_TOKEN_ID, max_len=64)),
        num_swap_blocks=body.int("num_swap_blocks", 0, MAX_BLOCK_ID),
        bytes_per_block=body.int("bytes_per_block", 0),
        prefill_tokens_per_s=max(0.0, body.float("prefill_tokens_per_s")),
        swap_bytes_per_s=max(0.0, body.float("swap_bytes_per_s")),
        # Optional (0 or absent: some layer attends to the whole context).
        sliding_window=body.int("sliding_window", 0, 1 << 30, optional=True) or None,
        rewrites_kv=body.bool("rewrites_kv"))
    return capacity, body.int("pid", 0)


def encode_plan(plan: StepPlan) -> bytes:
    body: dict[str, Any] = {"s": plan.step_id, "h": plan.running_handles,
                            "k": plan.running_num_tokens}
    if plan.new_requests:
        body["n"] = [{"h": r.handle, "t": r.token_ids, "p": r.prompt_len,
                      "c": r.num_computed_tokens, "k": r.num_new_tokens, "b": r.block_ids,
                      "sp": r.sampling.engine_dict()} for r in plan.new_requests]
    if plan.new_block_ids:
        body["b"] = [[handle, blocks] for handle, blocks in plan.new_block_ids.items()]
    if plan.finished_handles:
        body["f"] = plan.finished_handles
    for key, pairs in (("so", plan.swap_out), ("si", plan.swap_in), ("cp", plan.copies)):
        if pairs:
            body[key] = [x for pair in pairs for x in pair]
    return pack("plan", body)


def decode_plan(body: Body) -> StepPlan:
    plan = StepPlan(step_id=body.int("s", 0))
    plan.running_handles = body.ints("h")
    plan.running_num_tokens = body.ints("k", 1, 1 << 24)
    if len(plan.running_handles) != len(plan.running_num_tokens):
        raise ProtocolError("plan: 'h' and 'k' must have the same length")
    for item in body.list("n", optional=True):
        if not isinstance(item, dict):
            raise ProtocolError("plan: each new request must be a map")
        new = Body("plan.new", item)
        token_ids = new.ints("t", 0, MAX_TOKEN_ID)
        request = NewRequest(
            handle=new.int("h", 0), token_ids=token_ids,
            prompt_len=new.int("p", 1, len(token_ids)),
            num_computed_tokens=new.int("c", 0, len(token_ids)),
            num_new_tokens=new.int("k", 1, len(token_ids)),
            block_ids=new.ints("b", 0, MAX_BLOCK_ID),
            sampling=sampling_from_wire(new, "sp"))
        if request.num_computed_tokens + request.num_new_tokens > len(token_ids):
            raise ProtocolError("plan.new: computing past the known tokens")
        plan.new_requests.append(request)
    for entry in body.list("b", optional=True):
        if (not isinstance(entry, list) or len(entry) != 2 or isinstance(entry[0], bool)
                or not isinstance(entry[0], int)):
            raise ProtocolError("plan: 'b' entries must be [handle, [block ids]]")
        plan.new_block_ids[entry[0]] = Body("plan.b", {"b": entry[1]}).ints("b", 0, MAX_BLOCK_ID)
    plan.finished_handles = body.ints("f", optional=True)
    plan.swap_out = body.pairs("so", MAX_BLOCK_ID)
    plan.swap_in = body.pairs("si", MAX_BLOCK_ID)
    plan.copies = body.pairs("cp", MAX_BLOCK_ID)
    return plan


def encode_result(result: StepResult) -> bytes:
    body = {"s": result.step_id, "h": result.handles, "t": result.token_ids,
            "ms": result.forward_ms}
    if result.logprobs:
        body["lp"] = [None if e is None else list(e) for e in result.logprobs]
    if result.prompt_logprobs:
        body["plp"] = [[handle, start, [list(e) for e in entries]]
                       for handle, start, entries in result.prompt_logprobs]
    return pack("result", body)


def _decode_logprob_entry(entry: Any, where: str):
    if entry is None:
        return None
    if not isinstance(entry, list) or len(entry) != 4:
        raise ProtocolError(f"{where}: a logprobs entry is [logprob, rank, ids, logprobs]")
    one = Body(where, dict(zip(("lp", "r", "ids", "lps"), entry)))
    ids = one.ints("ids", 0, MAX_TOKEN_ID, max_len=1024)
    values = one.list("lps", max_len=1024)
    if len(values) != len(ids) or not all(
            isinstance(v, (int, float)) and not isinstance(v, bool) for v in values):
        raise ProtocolError(f"{where}: top-k logprobs must be numbers, one per id")
    return (one.float("lp"), one.int("r", 1), ids, [float(v) for v in values])


def decode_result(body: Body) -> StepResult:
    result = StepResult(step_id=body.int("s", 0), handles=body.ints("h"),
                        token_ids=body.ints("t", 0, MAX_TOKEN_ID),
                        forward_ms=body.float("ms", optional=True) or 0.0)
    if len(result.handles) != len(result.token_ids):
        raise ProtocolError("result: 'h' and 't' must have the same length")
    entries = body.list("lp", max_len=1 << 20, optional=True)
    if entries:
        if len(entries) != len(result.handles):
            raise ProtocolError("result: 'lp' must have one entry per handle")
        result.logprobs = [_decode_logprob_entry(e, "result.lp") for e in entries]
    for item in body.list("plp", max_len=1 << 16, optional=True):
        if not isinstance(item, list) or len(item) != 3:
            raise ProtocolError("result: 'plp' items are [handle, start, entries]")
        one = Body("result.plp", dict(zip(("h", "s", "e"), item)))
        entries = [_decode_logprob_entry(e, "result.plp") for e in one.list("e", 1 << 20)]
        if None in entries:
            raise ProtocolError("result: prompt logprobs entries cannot be empty")
        result.prompt_logprobs.append((one.int("h", 0), one.int("s", 1), entries))
    return result


def encode_executor_error(step_id: int, message: str) -> bytes:
    return pack("executor_error", {"s": step_id, "message": message[:2000]})


# ---- frontend <-> scheduler --------------------------------------------------------------

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

    def encode(self) -> bytes:
        return pack("engine_info", {
            "max_model_len": self.max_model_len, "vocab_size": self.vocab_size,
            "num_kv_blocks": self.num_kv_blocks, "block_size": self.block_size,
            "eos_token_ids": list(self.eos_token_ids), "executor_alive": self.executor_alive,
            "max_logprobs": self.max_logprobs, "max_n": self.max_n})

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
                   max_n=_or_default(body.int("max_n", 1, 1 << 20, optional=True), cls.max_n))


def _or_default(value: int | None, default: int) -> int:
    return default if value is None else value


def encode_add(request_id: str, prompt_token_ids: list[int], params: SamplingParams) -> bytes:
    return pack("add", {"id": request_id, "prompt": prompt_token_ids,
                        "params": params.engine_dict()})   # stop strings stay in the frontend


def decode_add(body: Body) -> tuple[str, list[int], SamplingParams]:
    return (body.str("id"), body.ints("prompt", 0, MAX_TOKEN_ID),
            sampling_from_wire(body, "params"))


def encode_abort(request_id: str) -> bytes:
    return pack("abort", {"id": request_id})


def encode_rejected(request_id: str, message: str, code: str = "rejected") -> bytes:
    return pack("rejected", {"id": request_id, "message": message[:2000], "code": code})


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
        reason = one.str("f", optional=True)
        if reason is not None and reason not in FINISH_REASONS:
            raise ProtocolError(f"outputs: unknown finish reason {reason!r}")
        output = EngineOutput(one.str("id"), one.ints("t", 0, MAX_TOKEN_ID), reason,
                              one.str("e", 4000, optional=True))
        if len(item) >= 5 and item[4] is not None:
            entries = one.list("lp", max_len=1 << 16)
            if len(entries) != len(output.new_token_ids) or None in entries:
                raise ProtocolError("outputs: one logprobs entry per new token")
            output.logprobs = [_decode_logprob_entry(e, "outputs.lp") for e in entries]
        if len(item) == 6:
            entries = [_decode_logprob_entry(e, "outputs.plp") for e in one.list("plp", 1 << 20)]
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


def encode_stats(stats: dict[str, Any]) -> bytes:
    return pack("stats", {"stats": stats})


MAX_KV_MAP_BLOCKS = 1 << 22    # per-block arrays longer than this are not sent
MAX_KV_MAP_REQUESTS = 1 << 16
KV_MAP_STATES = frozenset({"waiting", "running", "swapped", "preempted", "forking"})


def encode_kv_map(snapshot: dict[str, Any] | None, request_id: str | None = None) -> bytes:
    """The scheduler's page map (scheduler/kv_map.py), or {} without an executor; with
    request_id, the frontend's reply to a client's kv_map."""
    body: dict[str, Any] = {"map": snapshot or {}}
    if request_id is not None:
        body["id"] = request_id
    return pack("kv_map", body)


def decode_kv_map(body: Body) -> dict[str, Any] | None:
    """The page map, checked field by field (None: no executor attached)."""
    raw = body.map("map")
    if not raw:
        return None
    top = Body("kv_map.map", raw)
    num_blocks = top.int("num_blocks", 0, MAX_BLOCK_ID)
    top.int("block_size", 1, 1 << 16)
    top.int("max_model_len", 1, 1 << 30)
    top.int("step", 0)
    requests = top.list("requests", MAX_KV_MAP_REQUESTS)
    last = len(requests) - 1
    for item in requests:
        if not isinstance(item, dict):
            raise ProtocolError("kv_map: each request must be a map")
        one = Body("kv_map.requests", item)
        one.str("id")
        if one.str("state", 16) not in KV_MAP_STATES:
            raise one.fail("state", f"one of {sorted(KV_MAP_STATES)}")
        for name in ("blocks", "swap_blocks"):
            one.ints(name, 0, MAX_BLOCK_ID)
        for name in ("computed", "tokens", "prompt_tokens", "preemptions"):
            one.int(name, 0)
        one.int("max_tokens", 0, optional=True)
        one.float("wait_s")
        one.float("age_s")
    for name in ("running", "swapped", "waiting"):
        top.ints(name, 0, last, MAX_KV_MAP_REQUESTS)
    for entry in top.list("shared", MAX_KV_MAP_BLOCKS):
        if not (isinstance(entry, list) and len(entry) == 2):
            raise ProtocolError("kv_map: 'shared' entries are [block id, [owners]]")
        Body("kv_map.shared", {"b": entry[0], "o": entry[1]}).int("b", 0, num_blocks - 1)
        Body("kv_map.shared", {"o": entry[1]}).ints("o", 0, last, MAX_KV_MAP_REQUESTS)
    for name in ("totals", "contiguous"):
        section = top.map(name)
        for key in section:
            Body(f"kv_map.{name}", section).float(key)
    for name, states in (("blocks", "FUC"), ("swap", "FU")):
        if name not in raw:
            continue   # a pool too large for per-block arrays
        pages = Body(f"kv_map.{name}", top.map(name))
        state = pages.str("state", MAX_KV_MAP_BLOCKS)
        length = len(state)
        if (name == "blocks" and length != num_blocks) or not set(state) <= set(states):
            raise pages.fail("state", f"one character of {states!r} per block")
        arrays = ("ref", "fill", "owner") if name == "blocks" else ("fill", "owner")
        for array in arrays:
            low = -1 if array == "owner" else 0
            high = last if array == "owner" else MAX_BLOCK_ID
            if len(pages.ints(array, low, high, MAX_KV_MAP_BLOCKS)) != length:
                raise pages.fail(array, "one entry per block")
    return raw


def peek_id(data: bytes) -> str:
    """The "id" field of a message that failed validation, if it has a readable one."""
    try:
        _, body = unpack(data)
    except ProtocolError:
        return ""
    value = body.get("id", "")
    return value if isinstance(value, str) and 0 < len(value) <= 256 else ""


def decode(data: bytes, allowed: frozenset[str]) -> tuple[str, Body]:
    msg_type, body = unpack(data)
    if msg_type not in allowed:
        raise ProtocolError(f"unexpected message type {msg_type!r} on this socket")
    return msg_type, Body(msg_type, body)


def encode_heartbeat(pid: int, frontend: str | None = None) -> bytes:
    body: dict[str, Any] = {"pid": pid}
    if frontend is not None:   # from a frontend's heartbeat thread, on a socket of its own
        body["frontend"] = frontend
    return pack("heartbeat", body)


MAX_DROPPED_IDS = 4096   # request ids per frontend_dropped message


def encode_frontend_dropped(request_ids: list[str], reason: str) -> list[bytes]:
    """The scheduler gave up on a frontend and aborted these requests (in chunks)."""
    return [pack("frontend_dropped", {"ids": request_ids[i:i + MAX_DROPPED_IDS],
                                      "reason": reason[:2000]})
            for i in range(0, len(request_ids), MAX_DROPPED_IDS)]


def decode_frontend_dropped(body: Body) -> tuple[list[str], str]:
    ids = body.list("ids", MAX_DROPPED_IDS)
    if not all(isinstance(i, str) and len(i) <= 256 for i in ids):
        raise ProtocolError("frontend_dropped: 'ids' must be request ids")
    return ids, body.str("reason", 4000)


# ---- client <-> frontend -----------------------------------------------------------------
# Clients send "generate", "abort" and "health"; the frontend answers with "delta" (streams
# only), then exactly one "final" or "error" per generate, and "health" replies.

CLIENT_TYPES = frozenset({"generate", "abort", "health", "kv_map"})
MAX_PROMPT_CHARS = 8 * 2**20
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


def encode_error(request_id: str, code: str, message: str) -> bytes:
    return pack("error", {"id": request_id, "code": code, "message": message[:4000]})
