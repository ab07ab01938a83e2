"""ZeroMQ fuzz: random, truncated and hostile messages on every bound socket leave every process
serving; absurd values are refused, stray hellos ignored."""

from __future__ import annotations

import asyncio
import random
import time

import httpx
import msgpack
import pytest
import zmq
import zmq.asyncio
from folio.shared.protocol import messages as m
from folio.shared.config import ExecutorCapacity
from folio.shared.outputs import EngineOutput
from folio.shared.protocol.step import StepResult
from folio.shared.protocol.wire import PROTOCOL_VERSION

from folio import SamplingParams
from folio.client import AsyncClient
from tests.processes.cluster import LONG, sdk_stream, value_or_error

pytestmark = pytest.mark.slow


BAD_VALUES = [None, True, False, 0, -1, 2**31, 2**63 - 1, 2**64 - 1, -2**63, 1.5,
              float("nan"), float("inf"), -1e308, "", "x", "é" * 300, b"\x00\xff", [], [1, 2],
              ["a"], [None], [[1]], [-5], {}, {"a": 1}, {"": None}]


def _valid_messages(socket: str) -> list[bytes]:
    """Real encodings from shared/protocol/messages.py, the ones this socket accepts."""
    params = SamplingParams(max_tokens=2, temperature=0)
    if socket == "scheduler-frontends":
        return [m.encode_add("fz-1", [1, 2, 3, 4], params), m.encode_abort("fz-1"),
                m.pack("stats_request", {}), m.pack("frontend_hello", {"id": "fe-fuzz"}),
                m.encode_heartbeat(1)]
    if socket == "scheduler-executor":
        capacity = ExecutorCapacity(num_kv_blocks=64, block_size=16, max_model_len=1024,
                                    vocab_size=1024, eos_token_ids=(0,))
        result = StepResult(step_id=3, handles=[0, 1], token_ids=[5, 6])
        result.logprobs = [(-0.5, 1, [5, 7], [-0.5, -1.0]), None]
        return [m.encode_result(result), m.encode_executor_error(3, "RuntimeError: fuzz"),
                m.encode_heartbeat(1), m.encode_hello_executor(capacity, 1)]
    return [m.encode_generate("fz-g", params, True, prompt="hello"),
            m.encode_generate("fz-t", params, True, prompt_token_ids=[1, 2, 3]),
            m.encode_generate("fz-c", params, True, messages=[{"role": "user",
                                                                "content": "hi"}]),
            m.pack("abort", {"id": "fz-g"}), m.pack("health", {"id": "fz-h"})]


def _other_messages() -> list[bytes]:
    """Valid messages of other sockets: an unknown type wherever they land."""
    return [m.EngineInfo(1024, 1024, 64, 16).encode(), m.encode_rejected("x", "no"),
            m.encode_outputs([EngineOutput("x", [1], "stop")]), m.encode_stats({"a": 1}),
            m.pack("plan", {"s": 1, "h": [0], "k": [1]}), m.pack("reset", {}),
            m.encode_delta("x", "t", [1]), m.encode_final("x", "t", [1], "stop", 1),
            m.encode_error("x", "invalid", "no"), m.pack("nope", {}), m.pack("", {}),
            m.pack("x" * 10_000, {})]


def _replace_somewhere(rng: random.Random, value):
    """`value` with one field (at any depth of maps and lists) replaced by a bad value."""
    if isinstance(value, dict) and value and rng.random() < 0.7:
        key = rng.choice(list(value))
        return {**value, key: _replace_somewhere(rng, value[key])}
    if isinstance(value, list) and value and rng.random() < 0.5:
        index = rng.randrange(len(value))
        return value[:index] + [_replace_somewhere(rng, value[index])] + value[index + 1:]
    return rng.choice(BAD_VALUES)


def _huge_header(rng: random.Random) -> bytes:
    """msgpack headers that announce far more than follows (or than any limit allows)."""
    big = (2**32 - 1).to_bytes(4, "big")
    mid = (2**22 + 1).to_bytes(4, "big")
    header = rng.choice([b"\xdd" + big, b"\xdf" + big, b"\xdb" + big, b"\xc6" + big,
                         b"\xdd" + mid, b"\xdf" + mid, b"\xdc\xff\xff", b"\xde\xff\xff"])
    where = rng.randrange(3)
    if where == 0:
        return header + bytes(rng.randrange(256) for _ in range(rng.randrange(16)))
    if where == 1:   # as the body
        return b"\x93\x01\xa3add" + header + b"\xa2id"
    return b"\x93\x01" + header   # as the type


def fuzz_messages(socket: str, count: int, seed: int) -> list[list[bytes]]:
    """`count` messages (each a list of frames) for one socket."""
    rng = random.Random(seed)
    valid = _valid_messages(socket)
    others = _other_messages()
    decoded = [msgpack.unpackb(data, raw=False) for data in valid]
    out: list[list[bytes]] = []
    while len(out) < count:
        kind = rng.randrange(12)
        base = rng.choice(valid)
        if kind == 0:     # random bytes
            data = bytes(rng.randrange(256) for _ in range(rng.randrange(200)))
        elif kind == 1:   # truncated
            data = base[:rng.randrange(len(base))]
        elif kind == 2:   # flipped bits
            raw = bytearray(base)
            for _ in range(rng.randint(1, 4)):
                raw[rng.randrange(len(raw))] ^= 1 << rng.randrange(8)
            data = bytes(raw)
        elif kind == 3:   # bytes inserted or cut out
            cut = rng.randrange(len(base))
            data = (base[:cut] + bytes(rng.randrange(256) for _ in range(rng.randint(1, 8)))
                    + base[cut + rng.randrange(3):])
        elif kind in (4, 5, 6):   # a wrong type (or value) in one field, at any depth
            version, msg_type, body = rng.choice(decoded)
            data = msgpack.packb([version, msg_type, _replace_somewhere(rng, body)])
        elif kind == 7:   # wrong protocol version
            _, msg_type, body = rng.choice(decoded)
            version = rng.choice([0, 2, -1, 255, 2**64 - 1, "1", None, 1.5, [1], {}])
            data = msgpack.packb([version, msg_type, body])
        elif kind == 8:   # unknown types, and other sockets' messages
            data = rng.choice(others)
        elif kind == 9:   # huge lengths
            data = _huge_header(rng)
        elif kind == 10:  # wrong shapes
            _, msg_type, body = rng.choice(decoded)
            data = msgpack.packb(rng.choice([
                [PROTOCOL_VERSION, msg_type], [PROTOCOL_VERSION, msg_type, body, 1],
                {"v": 1, "t": msg_type, "b": body}, [PROTOCOL_VERSION, 5, body],
                [PROTOCOL_VERSION, msg_type, [body]], [PROTOCOL_VERSION, msg_type, None],
                "add", 7, None, []]))
        else:             # deep nesting, several frames, empty frames
            choice = rng.randrange(3)
            if choice == 0:
                data = b"\x91" * rng.randint(100, 100_000) + b"\xc0"
            elif choice == 1:
                out.append([base, base] if rng.random() < 0.5 else [b"", base, b""])
                continue
            else:
                data = b""
        if socket == "scheduler-executor" and _is_valid_hello(data):
            continue   # a stray executor's hello is its own test
        out.append([data])
    # Two big ones: a prompt of the most token ids a message may hold, and one more.
    for size in (2**22, 2**22 + 1):
        big = {"scheduler-frontends": m.pack("add", {"id": "fz-big", "prompt": [1] * size,
                                                     "params": {}}),
               "scheduler-executor": m.pack("result", {"s": 0, "h": [0] * size,
                                                       "t": [1] * size}),
               "frontend-clients": m.pack("generate", {"id": "fz-big", "params": {},
                                                       "prompt_token_ids": [1] * size})}
        out.insert(rng.randrange(len(out)), [big[socket]])
    return out


def _is_valid_hello(data: bytes) -> bool:
    try:
        _, body = m.decode(data, frozenset({"executor_hello"}))
        m.decode_hello_executor(body)
    except Exception:
        return False
    return True


def send_all(address: str, messages: list[list[bytes]]) -> None:
    """Each message sent to `address` on a socket of its own context; returns once all of
    them have left (the context's term waits for them), not after a guessed pause."""
    ctx = zmq.Context()
    try:
        sock = ctx.socket(zmq.DEALER)
        sock.setsockopt(zmq.LINGER, 30_000)   # a bound, should the peer never take them
        sock.setsockopt(zmq.SNDHWM, 0)
        sock.connect(address)
        for frames in messages:
            sock.send_multipart(frames)
        sock.close()
    finally:
        ctx.term()


def test_zeromq_fuzz_10000_messages_per_socket_leaves_everything_serving(healthy):
    targets = {"scheduler-frontends": healthy.frontend_address,
               "scheduler-executor": healthy.executor_address,
               "frontend-clients": healthy.client_addresses[0]}
    started = time.monotonic()
    for seed, (socket, address) in enumerate(targets.items()):
        messages = fuzz_messages(socket, 10_000, seed)
        send_all(address, messages)
        # Over the 64 MiB message limit: ZeroMQ drops this connection, nothing else.
        send_all(address, [[b"\x00" * (64 * 2**20 + 1)]])
        healthy.check_alive()
    print(f"fuzzed 3 sockets in {time.monotonic() - started:.1f} s")
    healthy.check_alive()
    healthy.wait_ready(timeout=30)   # the frontend may still be reading the fuzz
    for frontend in (0, 1):
        healthy.assert_serving(frontend)
    assert httpx.get(f"{healthy.base}/health").status_code == 200


def test_an_absurd_temperature_is_refused_and_the_largest_accepted_one_is_served(healthy):
    """temperature = 2**63 over HTTP and over the SDK wire is refused by name; 1e4 (the
    largest accepted: a near-uniform draw) is served. A request running beside both must
    finish normally (the executor must not fail the whole batch over one row)."""

    async def run():
        async with AsyncClient(healthy.client_addresses[0]) as client, \
                httpx.AsyncClient(base_url=healthy.base, timeout=30) as http:
            started = asyncio.Event()
            bystander = asyncio.create_task(sdk_stream(client, started))
            await asyncio.wait_for(started.wait(), 20)
            over_http = await http.post("/v1/completions", json={
                "prompt": "x", "max_tokens": 4, "temperature": 2**63})
            hot = await http.post("/v1/completions", json={
                "prompt": "x", "max_tokens": 4, "temperature": 1e4, "ignore_eos": True})
            raw = SamplingParams(max_tokens=4).to_dict() | {"temperature": 2**63}
            ctx = zmq.asyncio.Context()
            sock = ctx.socket(zmq.DEALER)
            try:
                sock.setsockopt(zmq.LINGER, 0)
                sock.connect(healthy.client_addresses[0])
                await sock.send(m.pack("generate", {"id": "hot", "params": raw,
                                                    "prompt_token_ids": [1, 2, 3]}))
                replies = []
                while not replies or replies[-1][0] not in ("final", "error"):
                    replies.append(m.unpack(await asyncio.wait_for(sock.recv(), 20)))
            finally:
                sock.close()
                ctx.term()
            tokens = await value_or_error(asyncio.wait_for(bystander, 60))
            return over_http, hot, replies[-1], tokens

    over_http, hot, over_sdk, tokens = asyncio.run(run())
    assert over_http.status_code == 400, over_http.text[:300]
    assert "temperature must be <= 10000" in over_http.json()["error"]["message"]
    assert over_sdk[0] == "error" and over_sdk[1]["code"] == "invalid", over_sdk
    assert "temperature" in over_sdk[1]["message"], over_sdk
    assert hot.status_code == 200, hot.text[:300]
    assert hot.json()["usage"]["completion_tokens"] == 4
    assert tokens == LONG, f"the request running beside it ended with {tokens!r}"


def test_a_stray_executor_hello_does_not_take_over_the_engine(healthy):
    """Any peer of the executor socket can send a well-formed executor_hello (a mutated
    message can be one). Once that peer is gone, the real executor must serve again."""
    capacity = ExecutorCapacity(num_kv_blocks=64, block_size=16, max_model_len=1024,
                                vocab_size=1024, eos_token_ids=(0,))
    ctx = zmq.Context()
    try:
        stray = ctx.socket(zmq.DEALER)
        stray.setsockopt(zmq.LINGER, 0)
        stray.connect(healthy.executor_address)
        stray.send(m.encode_hello_executor(capacity, 424242))
        time.sleep(0.5)
        stray.close()
    finally:
        ctx.term()
    healthy.wait_ready(timeout=10)
    healthy.assert_serving()


