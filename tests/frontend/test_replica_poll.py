"""The replicas' load poll and the prefix router: a replica's first start forgets nothing
the router already sent it (the gateways read engine_alive directly, so requests can reach a
replica before the poll has seen it serve), while a replica back after being seen down
forgets its prefixes (its cache may have restarted empty).

The replicas' clients are stand-ins whose liveness the test sets; the poll itself is the
real one, watched through its own `serving` list rather than timed."""

from __future__ import annotations

import asyncio

import zmq.asyncio

from folio.frontend.replicas import Replicas
from folio.shared.hf_tokenizer import load_tokenizer

PROMPT = [(5 + 37 * i) % 1000 + 3 for i in range(96)]   # six full blocks of 16


class Replica:
    """What the poll reads of one replica's engine client."""

    def __init__(self) -> None:
        self.engine_alive = False
        self.requests: dict = {}
        self.info = None

    @property
    def scheduler_alive(self) -> bool:
        return self.engine_alive

    async def stats(self, timeout: float) -> dict:
        return {"num_running": 0, "num_waiting": 0, "kv_blocks_free": 100}

    def dead_reason(self) -> str:
        return "set down by the test"

    def close(self) -> None:
        pass


async def _until(condition) -> None:
    while not condition():
        await asyncio.sleep(0.01)


def test_first_start_keeps_routes_and_a_return_forgets_them(tokenizer_dir, tmp_path):
    ctx = zmq.asyncio.Context()
    replicas = Replicas(load_tokenizer(tokenizer_dir),
                        [f"ipc://{tmp_path}/a.sock", f"ipc://{tmp_path}/b.sock"], ctx)
    for client in replicas.clients:
        client.close()
    stand_ins = [Replica(), Replica()]
    replicas.clients = stand_ins

    async def scenario() -> None:
        poll = asyncio.create_task(replicas._poll_load())
        try:
            await _until(lambda: all(replicas.polled))   # the poll saw both down
            assert replicas.serving == [False, False]
            for replica in stand_ins:   # both come up; a request arrives before the poll
                replica.engine_alive = True   # ... has seen either serve
            holder = replicas._route(PROMPT + [900])
            await _until(lambda: replicas.serving == [True, True])
            assert set(replicas.router.owner.values()) == {holder}
            assert {replicas._route(PROMPT + [901 + i]) for i in range(6)} == {holder}

            stand_ins[holder].engine_alive = False   # seen down, then back
            await _until(lambda: not replicas.serving[holder])
            stand_ins[holder].engine_alive = True
            await _until(lambda: replicas.serving[holder])
            assert holder not in replicas.router.owner.values()
        finally:
            poll.cancel()

    try:
        asyncio.run(scenario())
    finally:
        ctx.term()
