"""Publishes KV events (scheduler/kv_events.py) the way vLLM's ZMQ publisher does, so the
routers that read vLLM's stream (llm-d's endpoint picker, Dynamo's ZMQ relay) read Folio's:

- a PUB socket sends each batch as three frames: topic, sequence number (8 bytes, big
  endian, from 0), payload: msgpack of [timestamp, events] (and the data-parallel rank
  after them when set), vLLM's KVEventBatch;
- a ROUTER socket (replay_endpoint) answers a request naming a sequence number (8 bytes)
  with every batch kept from there on, each as (sequence, payload), then (-1, empty); it is
  served on a thread of its own, bounded per peer and in total (kv_event_replay.py).

It binds plain TCP as vLLM does (its subscribers speak no CURVE): keep the endpoint on a
private network, since events carry prompt token ids.
"""

from __future__ import annotations

import logging
import time

import msgpack
import zmq

from folio.scheduler.kv_event_replay import KeptBatches, ReplayServer
from folio.scheduler.kv_events import Event
from folio.shared.kv_events_config import KVEventsConfig

log = logging.getLogger("folio.scheduler")


class KVEventPublisher:
    def __init__(self, ctx: zmq.Context, config: KVEventsConfig) -> None:
        self.config = config
        self.topic = config.topic.encode()
        self.pub = ctx.socket(zmq.PUB)
        self.pub.setsockopt(zmq.SNDHWM, config.hwm)
        self.pub.setsockopt(zmq.LINGER, 0)
        self.pub.bind(config.endpoint)   # checked with the config (kv_events_config.py)
        self._kept = KeptBatches(config.buffer_steps)
        self.replay = None if config.replay_endpoint is None else \
            ReplayServer(ctx, config.replay_endpoint, self._kept)
        self._next_seq = 0
        log.info("publishing KV events on %s%s", config.endpoint,
                 f" (replay on {config.replay_endpoint})" if self.replay else "")

    def publish(self, events: list[Event]) -> None:
        if not events:
            return
        batch: list = [time.time(), events]
        if self.config.data_parallel_rank is not None:
            batch.append(self.config.data_parallel_rank)
        payload = msgpack.packb(batch, use_bin_type=True)
        seq = self._next_seq
        self._next_seq += 1
        self._kept.append(seq, payload)
        try:
            self.pub.send_multipart((self.topic, seq.to_bytes(8, "big"), payload),
                                    flags=zmq.NOBLOCK)
        except zmq.Again:   # past the high-water mark: subscribers catch up by replay
            pass

    def close(self) -> None:
        self.pub.close(0)
        if self.replay is not None:
            self.replay.close()
