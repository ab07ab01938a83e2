"""/v1/completions and /v1/chat/completions over the engine client, in OpenAI's shapes.

Each route's body arrives parsed and checked (frontend/openai/requests.py); what needs the
engine is done here: the structured output's admission, the prompt's tokens and their
checks against the model and its limits (the engine client's input processor,
frontend/input_processor.py, which the SDK gateway and folio.LLM use too), the submission,
and the answer (whole or streamed)."""

from __future__ import annotations

import asyncio
import json
import logging
import time
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

from folio.frontend.openai.errors import ApiError, invalid, too_long
from folio.frontend.openai.completion_body import (MAX_RESPONSE_LOGPROBS, Choice, PromptAnswer,
                                            completion_response, logprob_entries,
                                            too_large_message)
from folio.frontend.engine_api import Engine, FinalResult
from folio.frontend.input_processor import InputError, InputProcessor, ModelFacts
from folio.frontend.openai.logprobs import completion_logprobs
from folio.frontend.openai.requests import ChatRequest, CompletionRequest
from folio.frontend.openai.structured_output import admit
from folio.frontend.openai.tool_calls import ToolPlan, openai_calls
from folio.frontend.openai.tool_stream.answer_stream import ToolStream
from folio.frontend.reasoning.history import for_template
from folio.frontend.reasoning.parsers import Reasoning, request_reasoning
from folio.frontend.reasoning.stream import ReasoningStream
from folio.frontend.reasoning.tokens import reasoning_tokens
from folio.shared.protocol.codes import RefusalCode
from folio.shared.sampling_params import SamplingParams

log = logging.getLogger("folio.frontend")
# Steps per sample a stream's unread events may pile up before its reader counts as gone.
STREAM_BACKLOG_STEPS = 128
READER_GRACE_S = 1.0   # a stream over its backlog this long has a reader that stopped


class _Backlog:
    """A job's queue of engine events. A stream whose reader stays more than `limit` events
    behind for READER_GRACE_S is aborted (its blocks freed) and ends with a `slow_reader`
    error: the frontend buffers at most that (and the grace's worth) for a client that does
    not read. The grace tells a burst from a reader that stopped: events that arrive
    together (this process resumed after a stop, its loop was busy) are put before the
    reader had its turn, and a reader that reads empties the queue as soon as it runs."""

    def __init__(self, engine: Engine, queue: asyncio.Queue, limit: int | None) -> None:
        self.engine, self.queue, self.limit = engine, queue, limit
        self.request_ids: list[str] = []
        self.overflowed = False
        self.judging: asyncio.TimerHandle | None = None

    def put(self, item: tuple) -> None:
        if self.overflowed:
            return
        self.queue.put_nowait(item)
        if self.limit is not None and self.queue.qsize() > self.limit and self.judging is None:
            self.judging = asyncio.get_running_loop().call_later(READER_GRACE_S, self._judge)

    def _judge(self) -> None:
        self.judging = None
        if self.overflowed or self.queue.qsize() <= self.limit:
            return   # the reader caught up
        self.overflowed = True
        log.warning("aborting stream %s: its client stayed %d events behind",
                    ",".join(self.request_ids), self.limit)
        for request_id in self.request_ids:
            self.engine.abort(request_id)
        self.queue.put_nowait(("error", RefusalCode.SLOW_READER, f"the client fell more than "
                               f"{self.limit} events behind the stream; the request was "
                               "aborted"))


class _QueueSink:
    """Engine events for one submitted prompt, as ("delta"|"final"|"error", ...) items."""

    def __init__(self, backlog: _Backlog, offset: int) -> None:
        self.backlog, self.offset = backlog, offset

    def delta(self, index, text, token_ids, logprobs) -> None:
        self.backlog.put(("delta", self.offset + index, text, token_ids, logprobs))

    def final(self, result: FinalResult) -> None:
        self.backlog.put(("final", self.offset, result))

    def error(self, code: str, message: str) -> None:
        self.backlog.put(("error", code, message))


@dataclass
class _Job:
    engine: Engine
    queue: asyncio.Queue
    request_ids: list[str]
    prompt_ids: list[list[int]]
    n: int

    def abort(self) -> None:
        for request_id in self.request_ids:
            self.engine.abort(request_id)


async def _submit(engine: Engine, prompts: list[list[int]], params: SamplingParams,
                  deadline: float | None, stream: bool, client: str | None = None) -> _Job:
    if params.pooling is None and engine.pooling is not None:
        raise ApiError(400, "this server runs the pooling runner (embeddings, rerank, "
                       "score); it does not generate", "model", "wrong_runner")
    stops = await engine.stop_strings(params)   # once for every prompt and sample
    if engine.draining:
        raise ApiError(503, "the server is shutting down; retry later", code="shutting_down")
    if not engine.engine_alive:
        raise ApiError(503, f"the engine is unavailable: {engine.dead_reason()}",
                       code="engine_unavailable")
    queue: asyncio.Queue = asyncio.Queue()
    # A non-streaming job's events are read as they come; a stream's wait for its client.
    backlog = _Backlog(engine, queue,
                       STREAM_BACKLOG_STEPS * len(prompts) * params.n if stream else None)
    for i, p in enumerate(prompts):
        backlog.request_ids.append(
            engine.submit(p, params, _QueueSink(backlog, i * params.n), deadline, stops,
                          client))
    return _Job(engine, queue, backlog.request_ids, prompts, params.n)


def _tokenize(inputs: InputProcessor, prompts: list[str | list[int]]) -> list[list[int]]:
    return [inputs.tokenize(prompt=p) if isinstance(p, str) else inputs.tokenize(token_ids=p)
            for p in prompts]


def _chat_ids(inputs: InputProcessor, messages: list[dict[str, Any]],
              tools: list[dict[str, Any]] | None,
              template_kwargs: dict[str, Any] | None = None) -> list[int]:
    return inputs.tokenize(messages=messages, tools=tools, param="messages",
                           template_kwargs=template_kwargs)


def _refused(error: InputError) -> ApiError:
    """The input processor's refusal in OpenAI's words: "does not fit" has its own code."""
    if error.context_length:
        return too_long(error.message, error.param)
    return invalid(error.message, error.param)


def _check(engine: Engine, facts: ModelFacts, ids: list[int], params: SamplingParams,
           field: str, score_only: bool = False) -> None:
    try:
        engine.inputs.check_prompt(ids, params, facts, field, score_only)
        engine.inputs.check_params(params, facts)
    except InputError as error:
        raise _refused(error) from None


def _error_from_engine(code: str, message: str) -> ApiError:
    if code == RefusalCode.QUEUE_FULL:
        return ApiError(503, message, code="queue_full")
    if code == RefusalCode.ENGINE_DEAD:
        return ApiError(503, message, code="engine_unavailable")
    if code == RefusalCode.TIMEOUT:
        return ApiError(408, message, code="request_timeout", error_type="timeout_error")
    if code == RefusalCode.SHUTTING_DOWN:
        return ApiError(503, message, code="shutting_down")
    if code == RefusalCode.SLOW_READER:
        return ApiError(429, message, code="slow_reader", error_type="rate_limit_error")
    if code == RefusalCode.REQUEST_FAILED:   # this request alone; the server goes on
        return ApiError(500, message, code="request_failed", error_type="server_error")
    return ApiError(400, message)


async def _collect(job: _Job) -> list[FinalResult]:
    """Wait for every prompt's final result (non-streaming)."""
    results: list[FinalResult | None] = [None] * len(job.request_ids)
    while any(r is None for r in results):
        item = await job.queue.get()
        if item[0] == "final":
            results[item[1] // job.n] = item[2]
        elif item[0] == "error":
            raise _error_from_engine(item[1], item[2])
    return results   # type: ignore[return-value]


def _usage(results: list[FinalResult]) -> dict[str, int]:
    prompt = sum(r.prompt_tokens for r in results)
    completion = sum(len(s.token_ids) for r in results for s in r.samples)
    return {"prompt_tokens": prompt, "completion_tokens": completion,
            "total_tokens": prompt + completion}


async def _first_event(job: _Job):
    """A stream's first engine event, before any byte is sent: a refusal (queue full, bad
    request, engine down) then becomes a plain HTTP error with its own status."""
    item = await job.queue.get()
    if item[0] == "error":
        raise _error_from_engine(item[1], item[2])
    return item


def _sse(data: Any) -> str:
    return f"data: {json.dumps(data, ensure_ascii=False)}\n\n"


# ---- /v1/completions ---------------------------------------------------------------------

async def _echo_text(engine: Engine, prompt: str | list[int], ids: list[int]) -> str:
    """The prompt as sent (OpenAI and vLLM echo the string itself), or token ids decoded."""
    if isinstance(prompt, str):
        return prompt
    return await engine.prep.run(len(ids), engine.tokenizer.decode, ids)


def _prompt_answer(engine: Engine, first_index: int, result: FinalResult,
                   prefix: str, ids: list[int], echo: bool, score_only: bool
                   ) -> PromptAnswer:
    """One prompt's choices; with echo and logprobs, its table once for all of them."""
    choices = [Choice(first_index + sample.index, prefix + ("" if score_only else sample.text),
                      None if sample.logprobs is None else
                      [] if score_only else sample.logprobs,
                      "length" if score_only else sample.finish_reason,
                      None if score_only else sample.stop_reason)
               for sample in result.samples]
    echoed = None
    if echo and any(choice.logprobs is not None for choice in choices):
        echoed = (engine.tokenizer.decode(ids[:1]), result.prompt_logprobs or [])
    return PromptAnswer(choices, echoed)


async def create_completion(engine: Engine, request: CompletionRequest, model: str):
    """(the job, the answer: a dict, a Response built in pieces, or an SSE stream)."""
    params, prompts, echo, logprobs = (request.params, request.prompts, request.echo,
                                       request.logprobs)
    await admit(engine.grammars, request.constraint)   # off the loop, budgeted
    facts = engine.facts
    try:
        for prompt in prompts:   # before tokenizing: text that cannot fit however it splits
            if isinstance(prompt, str):
                engine.inputs.check_text(len(prompt), facts, "prompt")
        chars = sum(len(p) for p in prompts if isinstance(p, str))
        ids = await engine.prep.run(chars, _tokenize, engine.inputs, prompts)
    except InputError as error:
        raise _refused(error) from None
    for one in ids:
        _check(engine, facts, one, params, "prompt", request.score_only)
    if logprobs is not None and not request.stream.stream:   # a stream's go out one by one
        sizes = ([len(one) for one in ids], params.n, echo, request.generated_tokens,
                 logprobs)
        if logprob_entries(*sizes) > MAX_RESPONSE_LOGPROBS:
            raise invalid(too_large_message(*sizes, "logprobs"), "logprobs")
    job = await _submit(engine, ids, params, request.deadline, request.stream.stream,
                        request.client)
    request_id = f"cmpl-{uuid.uuid4().hex}"
    created = int(time.time())
    if request.stream.stream:
        return job, _stream_completion(job, request_id, created, model,
                                       request.stream.include_usage)
    try:
        results = await _collect(job)
    except BaseException:
        job.abort()
        raise
    usage = _usage(results)
    if request.score_only:
        usage = {**usage, "completion_tokens": 0, "total_tokens": usage["prompt_tokens"]}
    head = {"id": request_id, "object": "text_completion", "created": created,
            "model": model}
    answers = []
    for prompt_index, result in enumerate(results):
        prefix = await _echo_text(engine, prompts[prompt_index],
                                  ids[prompt_index]) if echo else ""
        answers.append(_prompt_answer(engine, prompt_index * params.n, result, prefix,
                                      ids[prompt_index], echo, request.score_only))
    if logprobs is None:
        return job, {**head, "choices": [vars(c) for a in answers for c in a.choices],
                     "usage": usage}
    entries = logprob_entries([len(one) for one in ids], params.n, echo,
                              request.generated_tokens, logprobs)
    return job, await completion_response(head, answers, usage, entries)


async def _stream_completion(job: _Job, request_id: str, created: int, model: str,
                             include_usage: bool) -> AsyncIterator[str]:
    head = {"id": request_id, "object": "text_completion", "created": created, "model": model}
    done: list[FinalResult] = []
    offsets: dict[int, int] = {}   # per choice: text sent so far (text_offset goes on)
    pending = await _first_event(job)
    while len(done) < len(job.request_ids):
        item, pending = (pending, None) if pending is not None else (await job.queue.get(),
                                                                     None)
        if item[0] == "delta":
            _, index, text, _, logprobs = item
            offset = offsets.get(index, 0)
            offsets[index] = offset + len(text)
            entries = None if logprobs is None else completion_logprobs(logprobs, offset)
            yield _sse({**head, "choices": [{"index": index, "text": text,
                                             "logprobs": entries, "finish_reason": None}]})
        elif item[0] == "final":
            _, offset, result = item
            done.append(result)
            for sample in result.samples:
                yield _sse({**head, "choices": [{
                    "index": offset + sample.index, "text": "", "logprobs": None,
                    "finish_reason": sample.finish_reason, "stop_reason": sample.stop_reason}]})
        else:
            error = _error_from_engine(item[1], item[2])
            yield _sse(error.body())
            return
    if include_usage:
        yield _sse({**head, "choices": [], "usage": _usage(done)})
    yield "data: [DONE]\n\n"


# ---- /v1/chat/completions ----------------------------------------------------------------

def _chat_logprobs(entries: list[dict[str, Any]] | None) -> dict[str, Any] | None:
    if entries is None:
        return None
    content = []
    for entry in entries:
        content.append({
            "token": entry["decoded_token"], "logprob": entry["logprob"],
            "bytes": list(entry["decoded_token"].encode("utf-8")),
            "top_logprobs": [{"token": text, "logprob": lp, "bytes": list(text.encode())}
                             for _, lp, text in entry["top"]]})
    return {"content": content}


async def create_chat_completion(engine: Engine, request: ChatRequest, model: str):
    """(the job, the answer: a dict or an SSE stream)."""
    tools, params = request.tools, request.params
    await admit(engine.grammars, request.constraint, tools.schemas)   # off the loop, budgeted
    facts = engine.facts
    try:
        engine.inputs.check_text(request.chars, facts, "messages")
    except InputError as error:
        raise _refused(error) from None
    try:
        messages = for_template(tools.messages(request.messages), request.reasoning_parser)
        ids = await engine.prep.run(request.chars, _chat_ids, engine.inputs, messages,
                                    tools.template_tools, request.template_kwargs)
    except InputError as error:
        raise _refused(error) from None
    _check(engine, facts, ids, params, "messages")
    reasoning = request_reasoning(request.reasoning_parser, engine.tokenizer, ids)
    job = await _submit(engine, [ids], params, request.deadline, request.stream.stream,
                        request.client)
    request_id = f"chatcmpl-{uuid.uuid4().hex}"
    created = int(time.time())
    if request.stream.stream:
        return job, _stream_chat(job, request_id, created, model,
                                 request.stream.include_usage, tools, reasoning)
    try:
        (result,) = await _collect(job)
    except BaseException:
        job.abort()
        raise
    choices = []
    for s in result.samples:
        message, finish = _chat_message(tools, s.text, s.finish_reason, reasoning)
        choices.append({"index": s.index, "message": message,
                        "logprobs": _chat_logprobs(s.logprobs), "finish_reason": finish,
                        "stop_reason": s.stop_reason})
    usage = _usage([result])
    if reasoning is not None:
        counted = await engine.prep.run(usage["completion_tokens"], _reasoning_tokens,
                                        reasoning, engine.tokenizer, result)
        usage["completion_tokens_details"] = {"reasoning_tokens": counted}
    return job, {"id": request_id, "object": "chat.completion", "created": created,
                 "model": model, "choices": choices, "usage": usage}


def _reasoning_tokens(reasoning: Reasoning, tokenizer, result: FinalResult) -> int:
    return sum(reasoning_tokens(reasoning, tokenizer, s.token_ids) for s in result.samples)


def _finish_reason(tools: ToolPlan, calls: list, finish: str | None) -> str | None:
    # OpenAI: "tool_calls" when the model chose to call; a forced named call ends "stop".
    if calls and finish == "stop" and tools.mode != "named":
        return "tool_calls"
    return finish


def _chat_message(tools: ToolPlan, text: str, finish: str | None,
                  reasoning: Reasoning | None = None) -> tuple[dict[str, Any], str | None]:
    """The answer's message: its reasoning apart (vLLM's reasoning_content, null when the
    model did not reason), tool calls read from the rest only."""
    message: dict[str, Any] = {"role": "assistant"}
    if reasoning is not None:
        message["reasoning_content"], text = reasoning.split(text)
    if tools.mode == "none":
        return {**message, "content": text}, finish
    content, calls = tools.read(text)
    message["content"] = content
    if calls:
        message["tool_calls"] = openai_calls(calls)
    return message, _finish_reason(tools, calls, finish)


async def _stream_chat(job: _Job, request_id: str, created: int, model: str,
                       include_usage: bool, tools: ToolPlan,
                       reasoning: Reasoning | None = None) -> AsyncIterator[str]:
    head = {"id": request_id, "object": "chat.completion.chunk", "created": created,
            "model": model}
    streams = None if tools.mode == "none" else {i: ToolStream(tools) for i in range(job.n)}
    readers = None if reasoning is None else {i: ReasoningStream(reasoning)
                                              for i in range(job.n)}
    pending = await _first_event(job)
    for index in range(job.n):
        yield _sse({**head, "choices": [{"index": index, "delta": {"role": "assistant",
                                                                   "content": ""},
                                         "logprobs": None, "finish_reason": None}]})
    while True:
        item, pending = (pending, None) if pending is not None else (await job.queue.get(),
                                                                     None)
        if item[0] == "delta":
            _, index, text, token_ids, logprobs = item
            thought, calls = "", []
            if readers is not None:
                thought, text = readers[index].feed(text, token_ids)
            if streams is not None:
                text, calls = streams[index].feed(text)
            if (readers is not None or streams is not None) and not thought and not text \
                    and not calls and logprobs is None:
                continue
            yield _sse({**head, "choices": [{"index": index,
                                             "delta": _delta(thought, text, calls),
                                             "logprobs": _chat_logprobs(logprobs),
                                             "finish_reason": None}]})
        elif item[0] == "final":
            result = item[2]
            for sample in result.samples:
                finish = sample.finish_reason
                if readers is not None:
                    thought, text = readers[sample.index].finish()
                    calls = []
                    if streams is not None:
                        text, calls = streams[sample.index].feed(text)
                    if thought or text or calls:
                        yield _sse({**head, "choices": [{
                            "index": sample.index, "delta": _delta(thought, text, calls),
                            "logprobs": None, "finish_reason": None}]})
                if streams is not None:
                    rest, entries, called = streams[sample.index].finish()
                    if rest:
                        yield _sse({**head, "choices": [{
                            "index": sample.index, "delta": {"content": rest},
                            "logprobs": None, "finish_reason": None}]})
                    if entries:
                        yield _sse({**head, "choices": [{
                            "index": sample.index, "delta": {"tool_calls": entries},
                            "logprobs": None, "finish_reason": None}]})
                    finish = _finish_reason(tools, [True] if called else [], finish)
                yield _sse({**head, "choices": [{"index": sample.index, "delta": {},
                                                 "logprobs": None,
                                                 "finish_reason": finish,
                                                 "stop_reason": sample.stop_reason}]})
            if include_usage:
                usage = _usage([result])
                if readers is not None:
                    usage["completion_tokens_details"] = {
                        "reasoning_tokens": sum(r.tokens for r in readers.values())}
                yield _sse({**head, "choices": [], "usage": usage})
            yield "data: [DONE]\n\n"
            return
        else:
            yield _sse(_error_from_engine(item[1], item[2]).body())
            return


def _delta(reasoning: str, text: str, calls: list) -> dict[str, Any]:
    """A chunk's delta: reasoning (vLLM's reasoning_content), content, tool call pieces."""
    delta: dict[str, Any] = {}
    if reasoning:
        delta["reasoning_content"] = reasoning
    if text or not (calls or reasoning):
        delta["content"] = text
    if calls:
        delta["tool_calls"] = calls
    return delta
