"""KV events from a real `folio serve --kv-events-config`, read by a subscriber written from
vLLM's documentation alone (examples/online_serving/kv_events_subscriber.py: a SUB socket
on the topic, frames topic / 8-byte big-endian sequence / msgpack KVEventBatch, replays
ending with an empty payload): the set of block hashes it rebuilds names exactly the blocks
of the prompts served, chained as Folio's prefix cache chains them. Replays are read on a
DEALER socket: a REQ socket (the example's) takes the first reply of a replay only, with
vLLM's publisher as with Folio's."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor

import msgpack
import pytest
import zmq

from folio.shared.prefix_hash import chain_hash
from tests.http_server import ROOT, free_port, serving

BLOCK = 16
TOPIC = "kv-events"


class Subscriber:
    """vLLM's documented subscriber, decoding the batch arrays by their documented layout:
    KVEventBatch = [ts, events(, data_parallel_rank)]; each event [tag, *fields]."""

    def __init__(self, endpoint: str, replay_endpoint: str) -> None:
        self.ctx = zmq.Context()
        self.sub = self.ctx.socket(zmq.SUB)
        self.sub.connect(endpoint)
        self.sub.setsockopt_string(zmq.SUBSCRIBE, TOPIC)
        self.replay = self.ctx.socket(zmq.DEALER)
        self.replay.connect(replay_endpoint)
        self.last_seq = -1
        self.cached: set[bytes] = set()
        self.stored: list[tuple[list[bytes], bytes | None, list[int]]] = []

    def apply(self, payload: bytes) -> None:
        ts, events, *rank = msgpack.unpackb(payload, raw=False)
        assert isinstance(ts, float) and not rank
        for event in events:
            tag = event[0]
            if tag == "BlockStored":
                _, hashes, parent, token_ids, block_size, lora_id, medium = event
                assert block_size == BLOCK and lora_id is None
                self.cached.update(hashes)
                self.stored.append((hashes, parent, token_ids))
            elif tag == "BlockRemoved":
                self.cached.difference_update(event[1])
            else:
                assert event == ["AllBlocksCleared"]
                self.cached.clear()

    def read_until(self, done, timeout: float = 60.0) -> None:
        """Read batches (and replays after a gap) until done() holds."""
        deadline = time.monotonic() + timeout
        while not done():
            assert time.monotonic() < deadline, f"events so far: {self.stored}"
            if not self.sub.poll(100):
                continue
            topic, seq_bytes, payload = self.sub.recv_multipart()
            assert topic == TOPIC.encode()
            seq = int.from_bytes(seq_bytes, "big")
            if seq > self.last_seq + 1:
                self.replay_from(self.last_seq + 1, until=seq - 1)
            if seq > self.last_seq:
                self.apply(payload)
                self.last_seq = seq

    def replay_from(self, first: int, until: int | None = None) -> list[int]:
        self.replay.send_multipart((b"", first.to_bytes(8, "big")))   # as a REQ frames it
        seen = []
        while self.replay.poll(10_000):
            _, seq_bytes, payload = self.replay.recv_multipart()
            if not payload:
                break   # the end-of-replay marker
            seq = int.from_bytes(seq_bytes, "big")
            seen.append(seq)
            if seq > self.last_seq and (until is None or seq <= until):
                self.apply(payload)
                self.last_seq = seq
        return seen

    def close(self) -> None:
        self.ctx.destroy(0)


def _prompt_hashes(prompt: list[int]) -> list[bytes]:
    hashes, parent = [], None
    for start in range(0, len(prompt) - len(prompt) % BLOCK, BLOCK):
        parent = chain_hash(parent, prompt[start:start + BLOCK])
        hashes.append(parent)
    return hashes


@pytest.fixture(scope="module")
def published(tmp_path_factory, llama_dir):
    endpoint, replay = f"tcp://127.0.0.1:{free_port()}", f"tcp://127.0.0.1:{free_port()}"
    config = {"enable_kv_cache_events": True, "publisher": "zmq", "endpoint": endpoint,
              "replay_endpoint": replay, "topic": TOPIC}
    with serving(llama_dir, tmp_path_factory.mktemp("kv-events"), "--num-kv-blocks", "64",
                 "--block-size", str(BLOCK), "--kv-events-config", json.dumps(config)) as srv:
        subscriber = Subscriber(endpoint, replay)
        try:
            yield srv, subscriber
        finally:
            subscriber.close()


def _complete(server, prompt: list[int], max_tokens: int = 4) -> None:
    import httpx

    answer = httpx.post(f"{server.base}/v1/completions", timeout=120, json={
        "prompt": prompt, "max_tokens": max_tokens, "temperature": 0})
    assert answer.status_code == 200, answer.text


def test_a_subscriber_rebuilds_the_blocks_of_the_prompts_served(published):
    server, subscriber = published
    shared = list(range(100, 100 + 2 * BLOCK))
    first, second = shared + [7] * (BLOCK + 3), shared + [9] * (BLOCK + 3)
    _complete(server, first)
    _complete(server, second)
    wanted = set(_prompt_hashes(first)) | set(_prompt_hashes(second))
    # The events come from the scheduler's loop, not the answer: read until they are in.
    subscriber.read_until(lambda: wanted <= subscriber.cached)
    # The two prompts share their first two blocks: stored once, so exactly 4 prompt blocks.
    stored = [h for hashes, _, _ in subscriber.stored for h in hashes]
    assert len([h for h in stored if h in wanted]) == len(wanted) == 4
    for hashes, parent, token_ids in subscriber.stored:   # chained as documented
        for index, block_hash in enumerate(hashes):
            assert chain_hash(parent, token_ids[index * BLOCK:(index + 1) * BLOCK]) == \
                block_hash
            parent = block_hash


def test_a_late_subscriber_replays_every_batch_from_the_first(published):
    server, subscriber = published
    _complete(server, list(range(300, 300 + 3 * BLOCK)))
    wanted = set(_prompt_hashes(list(range(300, 300 + 3 * BLOCK))))
    subscriber.read_until(lambda: wanted <= subscriber.cached)
    late = Subscriber(*_endpoints(server))
    try:
        seen = late.replay_from(0)
        assert seen == list(range(len(seen))) and seen[-1] >= subscriber.last_seq
        assert late.cached == subscriber.cached    # the same cache, from the replay alone
    finally:
        late.close()


def _poll(condition, what: str, timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, f"not seen: {what}"
        time.sleep(0.05)   # polling an observed state


def test_a_flooding_or_oversized_replay_peer_is_cut_off_and_nobody_else_notices(published):
    """5,000 replay requests from sequence 0 that the peer never reads, and a 2 MiB frame
    from another: the first is cut off (logged), the second's connection dropped by the
    socket's maximum message size; a new subscriber's replay is whole, a request is served
    and /health stays 200 (replays are served off the step loop, bounded)."""
    import httpx

    server, subscriber = published
    _complete(server, list(range(400, 400 + 2 * BLOCK)))
    ctx = zmq.Context()
    try:
        _, replay_endpoint = _endpoints(server)
        flood = ctx.socket(zmq.DEALER)
        flood.connect(replay_endpoint)
        for _ in range(5000):
            flood.send_multipart((b"", (0).to_bytes(8, "big")))
        _poll(lambda: "KV-event replay: cut off a peer" in server.log.read_text(),
              "the flooding peer cut off")
        big = ctx.socket(zmq.DEALER)
        monitor = big.get_monitor_socket(zmq.EVENT_DISCONNECTED)
        big.connect(replay_endpoint)
        big.send_multipart((b"", b"x" * (2 << 20)))
        assert monitor.poll(60_000), "the oversized frame's connection was not dropped"
        late = Subscriber(*_endpoints(server))
        try:
            seen = late.replay_from(0)
            assert seen == list(range(len(seen))) and seen[-1] >= 0
        finally:
            late.close()
        _complete(server, list(range(500, 500 + BLOCK)))
        assert httpx.get(f"{server.base}/health").status_code == 200
    finally:
        ctx.destroy(0)


def _endpoints(server) -> tuple[str, str]:
    args = server.proc.args
    config = json.loads(args[args.index("--kv-events-config") + 1])
    return config["endpoint"], config["replay_endpoint"]


BAD_CONFIGS = [
    ("{not json", "is not JSON"),
    ('{"enable_kv_cache_events": true, "publisher": "zmq", "max_queue_size": 5}',
     "unknown key(s) max_queue_size"),
    ('{"enable_kv_cache_events": true, "publisher": "kafka"}', "publisher must be one of"),
    ('{"enable_kv_cache_events": true, "publisher": "zmq", "endpoint": "tcp://*:5557"}',
     "refusing to bind"),
]


def _serve_with_config(model_dir, config: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "folio", "serve", "--model", str(model_dir),
                           "--kv-events-config", config], cwd=ROOT, capture_output=True,
                          text=True, timeout=120, check=False,
                          env={**{k: v for k, v in os.environ.items()
                                  if k != "FOLIO_ALLOW_WILDCARD"}, "PYTHONPATH": str(ROOT)})


@pytest.fixture(scope="module")
def config_refusals(llama_dir) -> dict[str, subprocess.CompletedProcess]:
    """`folio serve` with each of BAD_CONFIGS, run side by side (each a real process that
    only checks its flags and exits): by config."""
    with ThreadPoolExecutor(len(BAD_CONFIGS)) as pool:
        runs = {config: pool.submit(_serve_with_config, llama_dir, config)
                for config, _ in BAD_CONFIGS}
        return {config: run.result() for config, run in runs.items()}


@pytest.mark.parametrize("config, words", BAD_CONFIGS)
def test_a_bad_kv_events_config_is_refused_in_one_line(config_refusals, config, words):
    run = config_refusals[config]
    assert run.returncode == 2, run.stderr
    lines = run.stderr.strip().splitlines()
    assert len(lines) == 1 and "--kv-events-config" in lines[0] and words in lines[0], lines
