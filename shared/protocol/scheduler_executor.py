"""Scheduler <-> executor messages, each declared once (shared/protocol/schema.py; docs/protocol.md
§6): the executor's hello and step results, the scheduler's plans, resets and pings. `plan`
and `result` are the per-step hot path: short keys, handles instead of request ids, flat
lists, and hand-written codecs that tests/shared/protocol/test_message_types.py holds to their
declarations."""

from __future__ import annotations

from typing import Any, NamedTuple

from folio.shared.config import ExecutorCapacity
from folio.shared.protocol.links import Link
from folio.shared.sampling_params import MAX_LORA_NAME_CHARS, sampling_from_wire
from folio.shared.protocol.schema import (Bool, Bytes, Field, Float, Int, Ints, Items, ListOf, Message, Nil,
                                 Sampling, Shape, Str, number_text)
from folio.shared.spec_decode_config import MAX_SPECULATIVE_TOKENS
from folio.shared.protocol.step import NewRequest, StepPlan, StepResult
from folio.shared.protocol.wire import MAX_BLOCK_ID, MAX_TOKEN_ID, Body, ProtocolError, pack

MAX_FAILURE_CHARS = 500   # why one request failed in a step (result `x`)
MAX_CACHE_SCOPE_CHARS = 128   # a new request's `cs`: the client, as the frontend named it
MAX_RUN_TOKENS = 1 << 24   # tokens one plan asks of one running request
MAX_TOP_K = 1024   # top-k alternatives per logprobs entry
MAX_DRAFTS = MAX_SPECULATIVE_TOKENS   # drafts one request carries in one step
MAX_LORAS = 4096   # adapter names one message lists
MAX_POOLED_BYTES = 4 << 16   # one pooled vector: float32s of a hidden size up to 65,536
POOLED_VECTOR = Bytes(MAX_POOLED_BYTES)
# The pooling runner's task (shared/pooling/task.py): the executor's hello says it, the
# scheduler passes it on in engine_info. Absent: the generate runner.
POOLING_TASK = Shape("pooling", (
    Field("type", Str(8)),
    Field("normalize", Bool()),
    Field("hidden_size", Int(0, 1 << 16)),
    Field("score_tokens", ListOf(Str(256), 2)),
    Field("matryoshka", Bool()),
    Field("matryoshka_dimensions", Ints(1, 1 << 16, 256)),
))


class ExecutorHello(NamedTuple):
    capacity: ExecutorCapacity
    pid: int   # its heartbeats must carry the same
    ranks: tuple[int, ...] = ()   # tensor-parallel ranks' pids, rank 0 first


def _hello(values: dict[str, Any]) -> ExecutorHello:
    pid, ranks = values.pop("pid"), tuple(values.pop("ranks"))
    values["prefill_tokens_per_s"] = max(0.0, values["prefill_tokens_per_s"])
    values["swap_bytes_per_s"] = max(0.0, values["swap_bytes_per_s"])
    values["sliding_window"] = values["sliding_window"] or None   # 0: no window
    values["eos_token_ids"] = tuple(values["eos_token_ids"])
    values["loras"] = tuple(values["loras"])
    return ExecutorHello(ExecutorCapacity(**values), pid, ranks)


EXECUTOR_HELLO = Message("executor_hello", (Link.EXECUTOR_TO_SCHEDULER,), (
    # `ranks`: the pid of each tensor-parallel rank in rank order (empty: one process).
    Field("ranks", Ints(0, 1 << 31, 1024), default=()),
    Field("num_kv_blocks", Int(1, MAX_BLOCK_ID)),
    Field("block_size", Int(1, 1 << 16)),
    Field("max_model_len", Int(1, 1 << 30)),
    Field("vocab_size", Int(1, MAX_TOKEN_ID)),
    Field("eos_token_ids", Ints(0, MAX_TOKEN_ID, 64)),
    Field("pid", Int(0)),
    Field("num_swap_blocks", Int(0, MAX_BLOCK_ID)),
    Field("bytes_per_block", Int(0)),
    Field("prefill_tokens_per_s", Float(), rule="any; negative (and NaN) read as 0"),
    Field("swap_bytes_per_s", Float(), rule="same"),
    Field("sliding_window", Int(0, 1 << 30), default=0),   # 0: some layer sees everything
    Field("rewrites_kv", Bool(), default=False),
    Field("loras", ListOf(Str(MAX_LORA_NAME_CHARS), MAX_LORAS), default=()),   # adapter names
    Field("weight_bytes_per_step", Int(0), default=0),   # weights one decode step reads
    Field("pooling", POOLING_TASK, default=None),   # absent: the generate runner
    # A hybrid model's recurrent state slots and the bytes of one (0: no recurrent layers).
    Field("num_state_slots", Int(0, MAX_BLOCK_ID), default=0),
    Field("state_bytes", Int(0), default=0),
    Field("num_swap_state_slots", Int(0, MAX_BLOCK_ID), default=0),   # on the host
), build=_hello, table=True)


def encode_hello_executor(capacity: ExecutorCapacity, pid: int,
                          ranks: tuple[int, ...] = ()) -> bytes:
    """`ranks`: the pid of each tensor-parallel rank in rank order (empty: one process)."""
    values = {f.name: getattr(capacity, f.name, None) for f in EXECUTOR_HELLO.fields}
    return EXECUTOR_HELLO.pack(**values | {"pid": pid, "ranks": ranks,
                                           "sliding_window": capacity.sliding_window or 0})


decode_hello_executor = EXECUTOR_HELLO.decode


def encode_plan(plan: StepPlan) -> bytes:
    body: dict[str, Any] = {"s": plan.step_id, "h": plan.running_handles,
                            "k": plan.running_num_tokens}
    if plan.new_requests:
        body["n"] = [_new_request(r) for r in plan.new_requests]
    if plan.new_block_ids:
        # (handle, blocks) tuples: msgpack writes a tuple as the same array as a list.
        body["b"] = list(plan.new_block_ids.items())
    if plan.dropped_handles:
        body["f"] = plan.dropped_handles
    for key, pairs in (("so", plan.swap_out), ("si", plan.swap_in), ("cp", plan.copies)):
        if pairs:
            body[key] = [x for pair in pairs for x in pair]
    if plan.drafts:
        body["d"] = [x for pair in plan.drafts.items() for x in pair]
    if plan.state_copies:
        body["sc"] = [x for pair in plan.state_copies for x in pair]
    if plan.checkpoints:
        body["ck"] = [x for triple in plan.checkpoints for x in triple]
    for key, pairs in (("zo", plan.state_swap_out), ("zi", plan.state_swap_in)):
        if pairs:
            body[key] = [x for pair in pairs for x in pair]
    return pack("plan", body)


def _new_request(r: NewRequest) -> dict[str, Any]:
    item = {"h": r.handle, "t": r.token_ids, "p": r.prompt_len, "c": r.num_computed_tokens,
            "k": r.num_new_tokens, "b": r.block_ids, "sp": r.sampling.engine_dict()}
    if r.cache_scope is not None:
        item["cs"] = r.cache_scope
    if r.state_slot >= 0:
        item["st"] = r.state_slot
    return item


def decode_plan(body: Body) -> StepPlan:
    plan = StepPlan(step_id=body.int("s", 0))
    plan.running_handles = body.ints("h")
    plan.running_num_tokens = body.ints("k", 1, MAX_RUN_TOKENS)
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
            sampling=sampling_from_wire(new, "sp"),
            cache_scope=new.str("cs", MAX_CACHE_SCOPE_CHARS, optional=True),
            state_slot=_state_slot(new))
        if request.num_computed_tokens + request.num_new_tokens > len(token_ids):
            raise ProtocolError("plan.new: computing past the known tokens")
        plan.new_requests.append(request)
    for entry in body.list("b", optional=True):
        if (not isinstance(entry, list) or len(entry) != 2 or isinstance(entry[0], bool)
                or not isinstance(entry[0], int)):
            raise ProtocolError("plan: 'b' entries must be [handle, [block ids]]")
        plan.new_block_ids[entry[0]] = Body("plan.b", {"b": entry[1]}).ints("b", 0, MAX_BLOCK_ID)
    plan.dropped_handles = body.ints("f", optional=True)
    plan.swap_out = body.pairs("so", MAX_BLOCK_ID)
    plan.swap_in = body.pairs("si", MAX_BLOCK_ID)
    plan.copies = body.pairs("cp", MAX_BLOCK_ID)
    flat = body.ints("d", optional=True)
    if len(flat) % 2 or any(cap > MAX_DRAFTS for cap in flat[1::2]):
        raise ProtocolError(f"plan: 'd' is flat (handle, draft cap <= {MAX_DRAFTS}) pairs")
    plan.drafts = dict(zip(flat[0::2], flat[1::2]))
    plan.state_copies = body.pairs("sc", MAX_BLOCK_ID)
    flat = body.ints("ck", 0, optional=True)
    if len(flat) % 3 or any(tokens < 1 for tokens in flat[1::3]):
        raise ProtocolError("plan: 'ck' is flat (handle, tokens >= 1, slot) triples")
    plan.checkpoints = [tuple(flat[i:i + 3]) for i in range(0, len(flat), 3)]
    plan.state_swap_out = body.pairs("zo", MAX_BLOCK_ID)
    plan.state_swap_in = body.pairs("zi", MAX_BLOCK_ID)
    return plan


def _state_slot(new: Body) -> int:
    slot = new.int("st", 0, MAX_BLOCK_ID, optional=True)
    return -1 if slot is None else slot


def encode_result(result: StepResult) -> bytes:
    body = {"s": result.step_id, "h": result.handles, "t": result.token_ids,
            "ms": result.forward_ms}
    if result.logprobs:
        body["lp"] = [None if e is None else list(e) for e in result.logprobs]
    if result.prompt_logprobs:
        body["plp"] = [[handle, start, [list(e) for e in entries]]
                       for handle, start, entries in result.prompt_logprobs]
    if result.failed:
        body["x"] = [[handle, reason[:MAX_FAILURE_CHARS]] for handle, reason in result.failed]
    if result.drafts:
        body["sd"] = [x for entry in result.drafts for x in entry]
    if result.pooled:
        body["pl"] = [[handle, vector] for handle, vector in result.pooled]
    return pack("result", body)


def decode_logprob_entry(entry: Any, where: str):
    if entry is None:
        return None
    if not isinstance(entry, list) or len(entry) != 4:
        raise ProtocolError(f"{where}: a logprobs entry is [logprob, rank, ids, logprobs]")
    one = Body(where, dict(zip(("lp", "r", "ids", "lps"), entry)))
    ids = one.ints("ids", 0, MAX_TOKEN_ID, max_len=MAX_TOP_K)
    values = one.list("lps", max_len=MAX_TOP_K)
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
        result.logprobs = [decode_logprob_entry(e, "result.lp") for e in entries]
    for item in body.list("plp", max_len=1 << 16, optional=True):
        if not isinstance(item, list) or len(item) != 3:
            raise ProtocolError("result: 'plp' items are [handle, start, entries]")
        one = Body("result.plp", dict(zip(("h", "s", "e"), item)))
        entries = [decode_logprob_entry(e, "result.plp") for e in one.list("e", 1 << 20)]
        if None in entries:
            raise ProtocolError("result: prompt logprobs entries cannot be empty")
        result.prompt_logprobs.append((one.int("h", 0), one.int("s", 1), entries))
    for item in body.list("x", max_len=1 << 16, optional=True):
        if not isinstance(item, list) or len(item) != 2:
            raise ProtocolError("result: 'x' items are [handle, reason]")
        one = Body("result.x", dict(zip(("h", "r"), item)))
        result.failed.append((one.int("h", 0), one.str("r", MAX_FAILURE_CHARS)))
    flat = body.ints("sd", optional=True)
    if len(flat) % 3:
        raise ProtocolError("result: 'sd' is flat (handle, proposed, accepted) triples")
    result.drafts = [(flat[i], flat[i + 1], flat[i + 2]) for i in range(0, len(flat), 3)]
    if any(not accepted <= proposed <= MAX_DRAFTS for _, proposed, accepted in result.drafts):
        raise ProtocolError(f"result: 'sd' entries need accepted <= proposed <= {MAX_DRAFTS}")
    for item in body.list("pl", max_len=1 << 16, optional=True):
        if not isinstance(item, list) or len(item) != 2:
            raise ProtocolError("result: 'pl' items are [handle, vector bytes]")
        one = Body("result.pl", dict(zip(("h", "v"), item)))
        result.pooled.append((one.int("h", 0), POOLED_VECTOR.read(item[1], one, "v")))
    return result


EXECUTOR_ERROR = Message("executor_error", (Link.EXECUTOR_TO_SCHEDULER,), (
    Field("s", Int(0), "step_id"),
    Field("message", Str(2000, cut=2000)),   # "<ExceptionType>: <text>"
), value="ExecutorError")
ExecutorError = EXECUTOR_ERROR.value

# The scheduler probing that the executor's connection is still there; not answered.
PING = Message("ping", (Link.SCHEDULER_TO_EXECUTOR,), ())
# The scheduler gave up on the executor's state: empty the batch, say hello again.
RESET = Message("reset", (Link.SCHEDULER_TO_EXECUTOR, Link.RANK0_TO_RANKS), ())


def encode_executor_error(step_id: int, message: str) -> bytes:
    return EXECUTOR_ERROR.pack(step_id=step_id, message=message)


def encode_ping() -> bytes:
    return PING.pack()


def encode_reset() -> bytes:
    return RESET.pack()


decode_executor_error = EXECUTOR_ERROR.decode

# ---- plan and result: declared for the doc and the tests, coded by hand above ----------

LOGPROB_ENTRY = Items("logprobs entry", (
    Field("logprob", Float()),
    Field("rank", Int(1)),
    Field("top ids", Ints(0, MAX_TOKEN_ID, MAX_TOP_K)),
    Field("top logprobs", ListOf(Float(), MAX_TOP_K)),   # one per id
))
_BLOCK_PAIRS = Ints(0, MAX_BLOCK_ID)   # flat (source, destination) pairs: even length
_PAIRS_RULE = f"[0, {number_text(MAX_BLOCK_ID)}], even length"

NEW_REQUEST = Shape("plan.n", (
    Field("h", Int(0)),
    Field("t", Ints(0, MAX_TOKEN_ID)),
    Field("p", Int(1), rule="[1, len(`t`)]"),
    Field("c", Int(0), rule="[0, len(`t`)]"),
    Field("k", Int(1), rule="[1, len(`t`)], and `c + k ≤ len(t)`"),
    Field("b", Ints(0, MAX_BLOCK_ID)),
    Field("sp", Sampling(engine=True)),
    Field("cs", Str(MAX_CACHE_SCOPE_CHARS), default=None),
    # A hybrid model's request: its recurrent state slot (absent: no recurrent layers).
    Field("st", Int(0, MAX_BLOCK_ID), default=None),
))

PLAN = Message("plan", (Link.SCHEDULER_TO_EXECUTOR, Link.RANK0_TO_RANKS), (
    Field("s", Int(0)),
    Field("h", Ints()),
    Field("k", Ints(1, MAX_RUN_TOKENS), rule=f"[1, {number_text(MAX_RUN_TOKENS)}], "
                                           "as many as `h`"),
    Field("n", ListOf(NEW_REQUEST), default=None),
    Field("b", ListOf(Items("plan.b", (Field("handle", Int()),
                                       Field("block ids", Ints(0, MAX_BLOCK_ID))))),
          default=None),
    Field("f", Ints(), default=None),
    Field("so", _BLOCK_PAIRS, default=None, rule=_PAIRS_RULE),
    Field("si", _BLOCK_PAIRS, default=None, rule=_PAIRS_RULE),
    Field("cp", _BLOCK_PAIRS, default=None, rule=_PAIRS_RULE),
    Field("d", Ints(), default=None,
          rule=f"flat (handle, draft cap ≤ {MAX_DRAFTS}) pairs: even length"),
    Field("sc", _BLOCK_PAIRS, default=None, rule=_PAIRS_RULE),
    Field("ck", Ints(0), default=None, rule="flat (handle, tokens ≥ 1, slot) triples"),
    # A hybrid's state slots swapped out (device, CPU) and in (CPU, device).
    Field("zo", _BLOCK_PAIRS, default=None, rule=_PAIRS_RULE),
    Field("zi", _BLOCK_PAIRS, default=None, rule=_PAIRS_RULE),
), codec=(encode_plan, decode_plan), table=True)

RESULT = Message("result", (Link.EXECUTOR_TO_SCHEDULER,), (
    Field("s", Int(0)),
    Field("h", Ints()),
    Field("t", Ints(0, MAX_TOKEN_ID), rule=f"[0, {number_text(MAX_TOKEN_ID)}], as many as `h`"),
    Field("ms", Float(), default=0.0),
    Field("lp", ListOf(Nil(LOGPROB_ENTRY), 1 << 20), default=None,
          rule="one per handle of `h`, nil for a request that did not ask"),
    Field("plp", ListOf(Items("result.plp", (
        Field("handle", Int(0)), Field("start", Int(1)),
        Field("entries", ListOf(LOGPROB_ENTRY, 1 << 20))))), default=None),
    Field("x", ListOf(Items("result.x", (
        Field("handle", Int(0)),
        Field("reason", Str(MAX_FAILURE_CHARS, cut=MAX_FAILURE_CHARS))))), default=None),
    Field("sd", Ints(), default=None,
          rule=f"flat (handle, drafts proposed ≤ {MAX_DRAFTS}, drafts accepted ≤ proposed) "
               "triples"),
    Field("pl", ListOf(Items("result.pl", (
        Field("handle", Int(0)), Field("vector", POOLED_VECTOR)))), default=None,
          rule="pooling requests ended this step: [handle, little-endian float32 bytes]"),
), codec=(encode_result, decode_result),
   table=True)

DECLARED = (EXECUTOR_HELLO, RESULT, EXECUTOR_ERROR, PLAN, RESET, PING)
