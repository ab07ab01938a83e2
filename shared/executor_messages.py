"""Scheduler <-> executor messages: the executor's hello and step results, the scheduler's
plans, resets and pings (docs/protocol.md §6). `plan` and `result` are the per-step hot path:
short keys, handles instead of request ids, flat lists."""

from __future__ import annotations

from typing import Any, NamedTuple

from folio.shared.config import ExecutorCapacity
from folio.shared.sampling_params import sampling_from_wire
from folio.shared.step import NewRequest, StepPlan, StepResult
from folio.shared.wire import MAX_BLOCK_ID, MAX_TOKEN_ID, Body, ProtocolError, pack

MAX_FAILURE_CHARS = 500   # why one request failed in a step (result `x`)


def encode_hello_executor(capacity: ExecutorCapacity, pid: int,
                          ranks: tuple[int, ...] = ()) -> bytes:
    """`ranks`: the pid of each tensor-parallel rank in rank order (empty: one process)."""
    return pack("executor_hello", {"ranks": list(ranks),
        "num_kv_blocks": capacity.num_kv_blocks, "block_size": capacity.block_size,
        "max_model_len": capacity.max_model_len, "vocab_size": capacity.vocab_size,
        "eos_token_ids": list(capacity.eos_token_ids), "pid": pid,
        "num_swap_blocks": capacity.num_swap_blocks, "bytes_per_block": capacity.bytes_per_block,
        "prefill_tokens_per_s": capacity.prefill_tokens_per_s,
        "swap_bytes_per_s": capacity.swap_bytes_per_s,
        "sliding_window": capacity.sliding_window or 0, "rewrites_kv": capacity.rewrites_kv})


class ExecutorHello(NamedTuple):
    capacity: ExecutorCapacity
    pid: int   # its heartbeats must carry the same
    ranks: tuple[int, ...] = ()   # tensor-parallel ranks' pids, rank 0 first


def decode_hello_executor(body: Body) -> ExecutorHello:
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
    ranks = body.ints("ranks", 0, 1 << 31, max_len=1024, optional=True) or []
    return ExecutorHello(capacity, body.int("pid", 0), tuple(ranks))


def encode_plan(plan: StepPlan) -> bytes:
    body: dict[str, Any] = {"s": plan.step_id, "h": plan.running_handles,
                            "k": plan.running_num_tokens}
    if plan.new_requests:
        body["n"] = [{"h": r.handle, "t": r.token_ids, "p": r.prompt_len,
                      "c": r.num_computed_tokens, "k": r.num_new_tokens, "b": r.block_ids,
                      "sp": r.sampling.engine_dict()} for r in plan.new_requests]
    if plan.new_block_ids:
        # (handle, blocks) tuples: msgpack writes a tuple as the same array as a list.
        body["b"] = list(plan.new_block_ids.items())
    if plan.dropped_handles:
        body["f"] = plan.dropped_handles
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
    plan.dropped_handles = body.ints("f", optional=True)
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
    if result.failed:
        body["x"] = [[handle, reason[:MAX_FAILURE_CHARS]] for handle, reason in result.failed]
    return pack("result", body)


def decode_logprob_entry(entry: Any, where: str):
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
    return result


def encode_executor_error(step_id: int, message: str) -> bytes:
    return pack("executor_error", {"s": step_id, "message": message[:2000]})


class ExecutorError(NamedTuple):
    step_id: int
    message: str   # "<ExceptionType>: <text>"


def decode_executor_error(body: Body) -> ExecutorError:
    return ExecutorError(body.int("s", 0), body.str("message", 2000))


def encode_ping() -> bytes:
    """The scheduler probing that the executor's connection is still there; not answered."""
    return pack("ping", {})


def encode_reset() -> bytes:
    """The scheduler gave up on the executor's state: empty the batch, say hello again."""
    return pack("reset", {})
