"""The ZeroMQ client SDK: `AsyncClient` for asyncio code, `Client` for everything else.

    client = folio.Client("ipc:///tmp/folio-xyz/client.sock")
    print(client.generate("The for statement", SamplingParams(max_tokens=32)).text)
    for delta in client.stream("Hello", SamplingParams(max_tokens=16)):
        print(delta.text, end="", flush=True)

A server with CURVE on its client port (compose does this) needs keys:
`Client(address, curve_keys="folio-keys")` reads a directory written by `folio keys`, or pass
`server_public_key=` and `client_keys=(public, secret)` as Z85 strings.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import threading
import uuid
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import zmq
import zmq.asyncio

from folio.errors import (EngineDead, FolioError, RequestRejected, RequestTimeout,
                          ServerUnreachable, error_from_code)
from folio.shared.protocol import messages as m
from folio.shared.outputs import Logprob
from folio.shared.sampling_params import SamplingParams
from folio.shared.security import as_key, load_keys, make_client
from folio.shared.transport import DOWN_EVENTS, UP_EVENTS, Relink, configure, next_monitor_event
from folio.shared.protocol.wire import MAX_MESSAGE_BYTES, Body, ProtocolError

Prompt = str | list[int]
Key = str | bytes
_REFUSED_EVENTS = (zmq.EVENT_HANDSHAKE_FAILED_AUTH | zmq.EVENT_HANDSHAKE_FAILED_PROTOCOL
                   | zmq.EVENT_HANDSHAKE_FAILED_NO_DETAIL)


def _curve(curve_keys: str | None, server_public_key: Key | None,
           client_keys: tuple[Key, Key] | None) -> tuple[bytes, bytes, bytes] | None:
    """(server public, client public, client secret), or None for a plain connection."""
    if curve_keys is not None:
        if server_public_key is not None or client_keys is not None:
            raise ValueError("give curve_keys, or server_public_key and client_keys; not both")
        keys = load_keys(curve_keys)
        return keys.server_public, keys.client_public, keys.client_secret
    if server_public_key is None:
        if client_keys is not None:
            raise ValueError("client_keys needs server_public_key")
        return None
    if client_keys is None:   # an ephemeral key: encrypted, admitted only by an open server
        client_keys = zmq.curve_keypair()
    return as_key(server_public_key), as_key(client_keys[0]), as_key(client_keys[1])


@dataclass
class Usage:
    prompt_tokens: int
    completion_tokens: int
    total_tokens: int


@dataclass
class Sample:
    """One of a request's `n` samples."""

    index: int
    text: str
    token_ids: list[int]
    finish_reason: str
    logprobs: list[dict[int, Logprob]] | None = None
    stop_reason: str | None = None


@dataclass
class Completion:
    """`text`, `token_ids`, `finish_reason`, `logprobs` and `stop_reason` are sample 0's;
    `outputs` holds all `n` samples by index (as vLLM's RequestOutput.outputs)."""

    request_id: str
    text: str
    token_ids: list[int]
    finish_reason: str
    usage: Usage                                       # completion_tokens: all samples'
    logprobs: list[dict[int, Logprob]] | None = None   # per token: sampled + top k
    stop_reason: str | None = None                     # the stop string that matched
    # None for the first prompt token, then one dict per prompt token (prompt_logprobs).
    prompt_logprobs: list[dict[int, Logprob] | None] | None = None
    vector: list[float] | None = None   # a pooling request's answer (embed, score)
    outputs: list[Sample] = field(default_factory=list)


@dataclass
class Embedding:
    request_id: str
    embedding: list[float]
    usage: Usage


@dataclass
class Score:
    request_id: str
    score: float
    usage: Usage


@dataclass
class Delta:
    text: str
    token_ids: list[int] = field(default_factory=list)
    logprobs: list[dict[int, Logprob]] | None = None
    index: int = 0   # which of the request's n samples this is of


def _server_error(body: dict[str, Any]) -> FolioError:
    """The typed error for the frontend's `error` reply (its code picks the class)."""
    try:
        reply = m.decode_error(Body("error", body))
    except ProtocolError as error:
        return FolioError(f"the server sent a malformed error: {error}")
    return error_from_code(reply.code, reply.message)


def _decoded(decoder, kind: str, body: dict[str, Any]):
    """A reply's typed value; a malformed one is the server's fault, named."""
    try:
        return decoder(Body(kind, body))
    except ProtocolError as error:
        raise FolioError(f"the server sent a malformed {kind}: {error}") from None


def _logprobs(raw: list[dict[str, Any]] | None) -> list[dict[int, Logprob]] | None:
    if raw is None:
        return None
    result = []
    for entry in raw:
        one = {tid: Logprob(lp, i + 1, text) for i, (tid, lp, text) in enumerate(entry["top"])}
        if entry["token_id"] not in one:
            one[entry["token_id"]] = Logprob(entry["logprob"], entry["rank"],
                                             entry["decoded_token"])
        result.append(one)
    return result


class AsyncClient:
    def __init__(self, address: str, timeout: float | None = 600.0,
                 connect_timeout: float = 5.0, *, curve_keys: str | None = None,
                 server_public_key: Key | None = None,
                 client_keys: tuple[Key, Key] | None = None) -> None:
        self.address = address
        self.timeout = timeout
        self.connect_timeout = connect_timeout
        self._curve = _curve(curve_keys, server_public_key, client_keys)
        self._refused: str | None = None
        self._ctx: zmq.asyncio.Context | None = None
        self._sock: zmq.asyncio.Socket | None = None
        self._monitor: zmq.asyncio.Socket | None = None
        self._tasks: list[asyncio.Task] = []
        self._queues: dict[str, asyncio.Queue] = {}   # by wire id (one per call)
        self._calls: dict[str, str] = {}              # caller's request id -> wire id
        self._connected: asyncio.Event | None = None
        # Set once connected, or refused explicitly (a server that names its reason will
        # not change its mind on a retry): a call then fails at once, not at connect_timeout.
        self._settled: asyncio.Event | None = None
        self._lost: str | None = None

    async def _start(self) -> None:
        if self._sock is not None:
            return
        self._lost = None
        self._ctx = zmq.asyncio.Context()
        self._sock = configure(self._ctx.socket(zmq.DEALER))
        if self._curve is not None:
            make_client(self._sock, *self._curve)
        # before connect: see the first handshake
        self._monitor = self._sock.get_monitor_socket(
            UP_EVENTS | DOWN_EVENTS | _REFUSED_EVENTS)
        self._sock.connect(self.address)
        self._connected, self._settled = asyncio.Event(), asyncio.Event()
        self._tasks = [asyncio.create_task(self._receive()),
                       asyncio.create_task(self._watch(self._monitor))]

    async def close(self) -> None:
        self._lost = "the client was closed"
        for queue in self._queues.values():
            queue.put_nowait(ServerUnreachable(self._lost))
        for task in self._tasks:
            task.cancel()
        if self._tasks:   # bounded: a task that ignores its cancel must not hang close()
            await asyncio.wait(self._tasks, timeout=2.0)
        self._tasks = []
        if self._sock is not None:
            self._monitor.close(0)   # the watch task closes it too; term() waits for it
            self._sock.close(0)
            self._ctx.term()
            self._sock = None

    async def __aenter__(self) -> "AsyncClient":
        await self._start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    # ---- public API ---------------------------------------------------------------------

    async def generate(self, prompt: Prompt, params: SamplingParams | None = None, *,
                       request_id: str | None = None, timeout: float | None = None,
                       deadline: float | None = None, lora: str | None = None) -> Completion:
        """`timeout`: how long this client waits; `deadline`: how long the server lets the
        request run before aborting it (RequestTimeout either way); `lora`: the LoRA
        adapter to run with, by name (docs/lora.md)."""
        return await self._complete(_prompt_fields(prompt, deadline), _with_lora(params, lora),
                                    request_id, timeout)

    async def embed(self, prompts: Prompt | list[Prompt], *, dimensions: int | None = None,
                    timeout: float | None = None, lora: str | None = None
                    ) -> list[Embedding]:
        """Embeddings from a pooling-runner server (docs/sdk.md): one per prompt (a string
        or token ids), truncated to `dimensions` where the model declares Matryoshka sizes
        and normalised as the model says. The prompts run concurrently."""
        items = [prompts] if isinstance(prompts, str) or (prompts and all(
            isinstance(t, int) for t in prompts)) else list(prompts)
        done = await asyncio.gather(*(self._complete(
            {**_prompt_fields(p), "pooling": "embed", "dimensions": dimensions},
            _with_lora(None, lora), None, timeout) for p in items))
        return [Embedding(c.request_id, c.vector, c.usage) for c in done]

    async def score(self, text_1: str, text_2: str | list[str], *,
                    instruction: str | None = None, timeout: float | None = None,
                    lora: str | None = None) -> list[Score]:
        """A reranker's relevance score of each text_2 for text_1 (its probability of the
        `for` score token; docs/sdk.md). The pairs run concurrently."""
        documents = [text_2] if isinstance(text_2, str) else list(text_2)
        done = await asyncio.gather(*(self._complete(
            {"prompt": text_1, "text_2": d, "instruction": instruction, "pooling": "score"},
            _with_lora(None, lora), None, timeout) for d in documents))
        return [Score(c.request_id, c.vector[0], c.usage) for c in done]

    async def chat(self, messages: list[dict[str, str]], params: SamplingParams | None = None,
                   *, request_id: str | None = None, timeout: float | None = None,
                   deadline: float | None = None, lora: str | None = None) -> Completion:
        return await self._complete(_chat_fields(messages, deadline), _with_lora(params, lora),
                                    request_id, timeout)

    async def stream(self, prompt: Prompt, params: SamplingParams | None = None, *,
                     request_id: str | None = None, timeout: float | None = None,
                     deadline: float | None = None, lora: str | None = None
                     ) -> AsyncIterator[Delta]:
        # aclosing: break or aclose() on this stream closes the inner ones at once, and
        # _run's cleanup aborts the request (no waiting for garbage collection).
        async with contextlib.aclosing(self._deltas(_prompt_fields(prompt, deadline),
                                                    _with_lora(params, lora),
                                                    request_id, timeout)) as deltas:
            async for delta in deltas:
                yield delta

    async def stream_chat(self, messages: list[dict[str, str]],
                          params: SamplingParams | None = None, *,
                          request_id: str | None = None, timeout: float | None = None,
                          deadline: float | None = None, lora: str | None = None
                          ) -> AsyncIterator[Delta]:
        async with contextlib.aclosing(self._deltas(_chat_fields(messages, deadline),
                                                    _with_lora(params, lora),
                                                    request_id, timeout)) as deltas:
            async for delta in deltas:
                yield delta

    async def abort(self, request_id: str) -> None:
        """Abort this client's running request `request_id` (nothing if it is not running)."""
        await self._start()
        wire_id = self._calls.get(request_id)
        if wire_id is not None:
            await self._send(m.encode_abort(wire_id))

    async def health(self, timeout: float = 5.0) -> dict[str, Any]:
        request_id = uuid.uuid4().hex
        queue = await self._open(request_id)
        try:
            await self._send(m.encode_health_query(request_id))
            kind, body = await self._next(queue, timeout, request_id)
            if kind == "error":
                raise _server_error(body)
            health = _decoded(m.decode_health, kind, body)._asdict()
            del health["request_id"]
            if health["replicas"] is None:   # one engine: no replica list
                del health["replicas"]
            return health
        finally:
            self._queues.pop(request_id, None)

    async def kv_map(self, timeout: float = 5.0) -> dict[str, Any] | None:
        """The KV cache's page map (docs/protocol.md, `kv_map`); None without an executor."""
        request_id = uuid.uuid4().hex
        queue = await self._open(request_id)
        try:
            await self._send(m.encode_kv_map_query(request_id))
            kind, body = await self._next(queue, timeout, request_id)
            if kind == "error":
                raise _server_error(body)
            try:
                return m.decode_kv_map(Body(kind, body))
            except ProtocolError as error:
                raise FolioError(f"the server sent a malformed page map: {error}") from None
        finally:
            self._queues.pop(request_id, None)

    # ---- internals ----------------------------------------------------------------------

    async def _deltas(self, fields, params, request_id, timeout) -> AsyncIterator[Delta]:
        async with contextlib.aclosing(self._run(fields, params, request_id, timeout,
                                                 True)) as items:
            async for item in items:
                if isinstance(item, Delta):
                    yield item

    async def _complete(self, fields, params, request_id, timeout) -> Completion:
        final = None
        async for item in self._run(fields, params, request_id, timeout, False):
            final = item
        return final

    async def _run(self, fields: dict[str, Any], params: SamplingParams | None,
                   request_id: str | None, timeout: float | None, stream: bool):
        params = params or SamplingParams()
        # On the wire every call has an id of its own: replies to an abandoned call that
        # used the same request_id can never reach this one.
        wire_id = uuid.uuid4().hex
        request_id = request_id or wire_id
        payload = m.encode_generate(wire_id, params, stream, **fields)
        if len(payload) > MAX_MESSAGE_BYTES:   # the server would drop this connection
            raise RequestRejected(f"the request ({len(payload)} bytes) exceeds the "
                                  f"{MAX_MESSAGE_BYTES}-byte message limit")
        if request_id in self._calls:
            raise RequestRejected(f"request id {request_id!r} is already running on this "
                                  "client; wait for it or abort it first")
        self._calls[request_id] = wire_id   # before any await: a second call sees it
        done = True   # nothing to abort until it is sent
        try:
            queue = await self._open(wire_id)
            done = False
            await self._send(payload)
            while True:
                kind, body = await self._next(queue, timeout, request_id)
                if kind == "delta":
                    delta = _decoded(m.decode_delta, kind, body)
                    yield Delta(delta.text, delta.token_ids, _logprobs(delta.logprobs),
                                delta.index)
                elif kind == "final":
                    done = True
                    yield _completion(request_id, _decoded(m.decode_final, kind, body))
                    return
                elif kind == "error":
                    done = True
                    raise _server_error(body)
        finally:
            self._queues.pop(wire_id, None)
            self._calls.pop(request_id, None)
            if not done and self._lost is None:
                # Abandoned (timeout, cancel, consumer stopped): free its KV blocks.
                try:
                    await self._send(m.encode_abort(wire_id))
                except FolioError:
                    pass

    async def _open(self, request_id: str) -> asyncio.Queue:
        await self._start()
        try:
            async with asyncio.timeout(self.connect_timeout):
                await self._settled.wait()
        except TimeoutError:
            raise ServerUnreachable(self._refused or (
                f"no Folio server answered at {self.address} within "
                f"{self.connect_timeout:g} s")) from None
        if not self._connected.is_set():   # refused explicitly
            raise ServerUnreachable(self._refused)
        if request_id in self._queues:
            raise FolioError(f"request id {request_id!r} is already in use on this client")
        queue: asyncio.Queue = asyncio.Queue()
        self._queues[request_id] = queue
        return queue

    async def _next(self, queue: asyncio.Queue, timeout: float | None, request_id: str):
        limit = self.timeout if timeout is None else timeout
        try:
            async with asyncio.timeout(limit):   # not wait_for: it can drop a cancel (3.11)
                item = await queue.get()
        except TimeoutError:
            raise RequestTimeout(f"request {request_id} got no answer within {limit:g} s; "
                                 "it was aborted") from None
        if isinstance(item, FolioError):
            raise item
        return item

    def _refusal(self, event: int) -> str:
        """What a failed handshake means. Only an explicit refusal is about keys: a server
        that closes the connection mid-handshake may be out of descriptors or overloaded."""
        if event & zmq.EVENT_HANDSHAKE_FAILED_AUTH:
            return (f"the server at {self.address} refused this client's CURVE key: it is "
                    "not on the server's list of client keys")
        if event & zmq.EVENT_HANDSHAKE_FAILED_PROTOCOL:
            return (f"the server at {self.address} wants CURVE keys (curve_keys=, or "
                    "server_public_key= and client_keys=)" if self._curve is None else
                    f"the server at {self.address} does not use CURVE: connect without keys")
        return (f"the server at {self.address} closed the connection during the handshake: "
                "it may be out of file descriptors or overloaded" +
                ("" if self._curve is None else ", or server_public_key is not its key"))

    async def _send(self, payload: bytes) -> None:
        if self._lost is not None or self._sock is None:
            raise ServerUnreachable(self._lost or "the client is closed")
        await self._sock.send(payload)

    async def _receive(self) -> None:
        while True:
            data = await self._sock.recv()
            try:
                kind, body = m.unpack(data)
            except ProtocolError:
                continue
            if kind not in m.GATEWAY_TO_CLIENT:
                continue
            queue = self._queues.get(body.get("id")) if isinstance(body.get("id"), str) else None
            if queue is not None:
                queue.put_nowait((kind, body))

    async def _watch(self, monitor: zmq.asyncio.Socket) -> None:
        relink = Relink(self._sock, self.address)   # a link cut by an oversize message
        explicit = False   # a refusal that named its reason was seen since the last link
        try:
            while True:
                event = await next_monitor_event(monitor, 0.5)
                if event is None:
                    relink.check()
                    continue
                relink.on_event(event)
                if event & UP_EVENTS:
                    self._lost = self._refused = None
                    explicit = False
                    self._connected.set()
                    self._settled.set()
                elif event & _REFUSED_EVENTS:
                    # A reset mid-handshake (no detail) can follow an explicit refusal on a
                    # retry, under load: the explicit one is the diagnosis, keep it.
                    if not (event & zmq.EVENT_HANDSHAKE_FAILED_NO_DETAIL and explicit):
                        self._refused = self._refusal(event)
                    explicit = explicit or not event & zmq.EVENT_HANDSHAKE_FAILED_NO_DETAIL
                    if explicit:
                        self._settled.set()
                elif event & DOWN_EVENTS:
                    self._connected.clear()
                    self._settled.clear()
                    self._lost = f"lost the connection to the Folio server at {self.address}"
                    for queue in self._queues.values():
                        queue.put_nowait(EngineDead(self._lost))
        finally:
            monitor.close(0)


class Client:
    """Blocking client: an AsyncClient on a private event-loop thread. Thread-safe."""

    def __init__(self, address: str, timeout: float | None = 600.0,
                 connect_timeout: float = 5.0, **curve: Any) -> None:
        """`curve`: curve_keys=, or server_public_key= and client_keys=, as AsyncClient."""
        self._async = AsyncClient(address, timeout, connect_timeout, **curve)
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, daemon=True,
                                        name="folio-client")
        self._thread.start()
        self._call(self._async._start())

    def _call(self, coro):
        return asyncio.run_coroutine_threadsafe(coro, self._loop).result()

    def generate(self, prompt: Prompt, params: SamplingParams | None = None, **kwargs
                 ) -> Completion:
        return self._call(self._async.generate(prompt, params, **kwargs))

    def embed(self, prompts: Prompt | list[Prompt], **kwargs) -> list[Embedding]:
        return self._call(self._async.embed(prompts, **kwargs))

    def score(self, text_1: str, text_2: str | list[str], **kwargs) -> list[Score]:
        return self._call(self._async.score(text_1, text_2, **kwargs))

    def chat(self, messages: list[dict[str, str]], params: SamplingParams | None = None,
             **kwargs) -> Completion:
        return self._call(self._async.chat(messages, params, **kwargs))

    def stream(self, prompt: Prompt, params: SamplingParams | None = None, **kwargs
               ) -> Iterator[Delta]:
        return self._iterate(self._async.stream(prompt, params, **kwargs))

    def stream_chat(self, messages: list[dict[str, str]], params: SamplingParams | None = None,
                    **kwargs) -> Iterator[Delta]:
        return self._iterate(self._async.stream_chat(messages, params, **kwargs))

    def abort(self, request_id: str) -> None:
        self._call(self._async.abort(request_id))

    def health(self, timeout: float = 5.0) -> dict[str, Any]:
        return self._call(self._async.health(timeout))

    def kv_map(self, timeout: float = 5.0) -> dict[str, Any] | None:
        return self._call(self._async.kv_map(timeout))

    def close(self) -> None:
        if self._loop.is_running():
            self._call(self._async.close())
            self._loop.call_soon_threadsafe(self._loop.stop)
            self._thread.join(timeout=5)

    def __enter__(self) -> "Client":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _iterate(self, agen) -> Iterator[Delta]:
        try:
            while True:
                try:
                    yield self._call(agen.__anext__())
                except StopAsyncIteration:
                    return
        finally:
            self._call(agen.aclose())


def _completion(request_id: str, final: m.FinalReply) -> Completion:
    if final.samples is None:   # n = 1: the top-level fields are the one sample
        outputs = [Sample(0, final.text, final.token_ids, final.finish_reason,
                          _logprobs(final.logprobs), final.stop_reason)]
    else:
        outputs = sorted((Sample(s["index"], s["text"], s["token_ids"], s["finish_reason"],
                                 _logprobs(s.get("logprobs")), s.get("stop_reason"))
                          for s in final.samples), key=lambda s: s.index)
    first = outputs[0]
    return Completion(request_id, first.text, first.token_ids, first.finish_reason,
                      Usage(**final.usage), first.logprobs, first.stop_reason,
                      None if final.prompt_logprobs is None else
                      [None, *_logprobs(final.prompt_logprobs)],
                      None if final.pooled is None else
                      np.frombuffer(final.pooled, dtype="<f4").tolist(), outputs)


def _with_lora(params: SamplingParams | None, lora: str | None) -> SamplingParams | None:
    """params (or the defaults) run with LoRA adapter `lora`; None leaves them as given."""
    if lora is None:
        return params
    return dataclasses.replace(params or SamplingParams(), lora=lora)


def _prompt_fields(prompt: Prompt, deadline: float | None = None) -> dict[str, Any]:
    if isinstance(prompt, str):
        fields: dict[str, Any] = {"prompt": prompt}
    elif isinstance(prompt, (list, tuple)):
        fields = {"prompt_token_ids": list(prompt)}
    else:
        raise TypeError("prompt must be a string or a list of token ids")
    return {**fields, "deadline": deadline} if deadline is not None else fields


def _chat_fields(messages: list[dict[str, str]], deadline: float | None) -> dict[str, Any]:
    fields: dict[str, Any] = {"messages": messages}
    return {**fields, "deadline": deadline} if deadline is not None else fields
