"""Data-parallel replicas behind one frontend: one engine client per replica's scheduler,
seen by the gateways as one engine (frontend/engine_api.py's `Engine`).

Each request goes to one replica (frontend/routing.py: its prompt's prefix, else the least
loaded); its outputs, abort and failure stay with that replica's client, so a replica that
dies fails only its own requests, and gets no new ones until it serves again. Load is what
this frontend has in flight on each replica, or the replica's own running + waiting count
(other frontends' requests included) from stats polled every LOAD_POLL_S, whichever is
larger.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any

import zmq.asyncio

from folio.frontend.engine_client import EngineClient
from folio.frontend.engine_api import Sink
from folio.frontend.input_processor import ModelFacts
from folio.frontend.routing import PrefixRouter, ReplicaLoad, RoutingConfig
from folio.frontend.stop_strings import StopStrings
from folio.shared.sampling_params import SamplingParams
from folio.shared.security import CurveKeys

log = logging.getLogger("folio.frontend")

LOAD_POLL_S = 0.5
_SUMMED = ("kv_blocks_total", "kv_blocks_free", "kv_blocks_used", "kv_blocks_cached",
           "swap_blocks_total", "swap_blocks_free", "num_running", "num_waiting",
           "num_swapped", "prefix_cache_queries", "prefix_cache_hits",
           "preemptions_recompute", "preemptions_swap", "spec_decode_num_drafts",
           "spec_decode_num_draft_tokens", "spec_decode_num_accepted_tokens")


class Replicas:
    def __init__(self, tokenizer: Any, scheduler_addresses: list[str],
                 ctx: zmq.asyncio.Context, keys: CurveKeys | None = None,
                 routing: RoutingConfig = RoutingConfig()) -> None:
        self.clients = [EngineClient(tokenizer, address, ctx, keys)
                        for address in scheduler_addresses]
        self.addresses = list(scheduler_addresses)
        first = self.clients[0]
        self.tokenizer = first.tokenizer
        self.inputs = first.inputs
        self.prep = first.prep
        self.grammars = first.grammars
        self.observers: list[Any] = []
        for client in self.clients:   # one list: metrics see every replica's requests
            client.observers = self.observers
        self.frontend_id = first.frontend_id
        self.router = PrefixRouter(routing)
        self.polled: list[dict[str, Any]] = [{} for _ in self.clients]
        self.serving = [False] * len(self.clients)   # as the load poll last saw it
        self.served = [False] * len(self.clients)    # ... serving at least once
        self.routed = [0] * len(self.clients)   # requests sent to each replica, ever

    # ---- one engine to the gateways -----------------------------------------------------

    @property
    def draining(self) -> bool:
        return self.clients[0].draining

    @draining.setter
    def draining(self, value: bool) -> None:
        for client in self.clients:
            client.draining = value

    @property
    def requests(self) -> dict[str, Any]:
        return {rid: r for client in self.clients for rid, r in client.requests.items()}

    def _serving(self) -> list[int]:
        """Indexes of the replicas serving now."""
        return [i for i, c in enumerate(self.clients) if c.engine_alive]

    def _live(self) -> list[EngineClient]:
        return [self.clients[i] for i in self._serving()]

    def _informed(self) -> EngineClient:
        """A replica whose engine_info is known (the live one first): they all serve the
        same model with the same limits."""
        for client in self._live() + self.clients:
            if client.info is not None:
                return client
        return self.clients[0]

    @property
    def scheduler_alive(self) -> bool:
        return any(c.scheduler_alive for c in self.clients)

    @property
    def engine_alive(self) -> bool:
        return bool(self._live())

    @property
    def info(self):
        return self._informed().info

    @property
    def vocab_size(self) -> int:
        return self._informed().vocab_size

    @property
    def limits(self) -> tuple[int, int]:
        return self._informed().limits

    @property
    def max_model_len(self) -> int | None:
        return self._informed().max_model_len

    @property
    def loras(self) -> tuple[str, ...]:
        """Adapters some serving replica holds (every replica loads the same ones; one
        that restarted or missed a load is left out of its adapters' routing)."""
        names = {name for client in self._live() for name in client.loras}
        return tuple(sorted(names))

    @property
    def pooling(self):
        return self._informed().pooling   # every replica runs the same engine settings

    @property
    def facts(self) -> ModelFacts:
        return self._informed().facts

    def check_text_size(self, chars: int) -> None:
        self._informed().check_text_size(chars)

    def dead_reason(self) -> str:
        return "no replica is serving: " + "; ".join(
            f"replica {i}: {c.dead_reason()}" for i, c in enumerate(self.clients))

    def replica_health(self) -> list[dict[str, Any]]:
        return [self._health_of(i, c) for i, c in enumerate(self.clients)]

    def rank_health(self) -> list[dict[str, Any]]:
        """Empty: each replica's ranks are listed under it (replica_health)."""
        return []

    def _health_of(self, index: int, client: EngineClient) -> dict[str, Any]:
        health = {"replica": index, "address": self.addresses[index],
                  "status": "ok" if client.engine_alive else "unhealthy",
                  **({} if client.engine_alive else {"reason": client.dead_reason()}),
                  "in_flight": len(client.requests), "routed": self.routed[index]}
        ranks = client.rank_health()
        if ranks:   # a tensor-parallel executor
            health["ranks"] = ranks
        return health

    def tasks(self) -> list:
        return [task for c in self.clients for task in c.tasks()] + [self._poll_load()]

    def close(self) -> None:
        for client in self.clients:
            client.close()

    # ---- requests -----------------------------------------------------------------------

    def submit(self, prompt_ids: list[int], params: SamplingParams, sink: Sink,
               deadline_s: float | None = None, stops: StopStrings | None = None,
               client: str | None = None) -> str:
        index = self._route(prompt_ids, params.lora)
        self.routed[index] += 1
        return self.clients[index].submit(prompt_ids, params, sink, deadline_s, stops, client)

    def _route(self, prompt_ids: list[int], lora: str | None = None) -> int:
        live = self._serving()
        if not live:   # the gateways refuse first; a replica may die in between
            live = list(range(len(self.clients)))
        if lora is not None:   # only replicas holding the adapter (if none: its refusal)
            live = [i for i in live if lora in self.clients[i].loras] or live
        info = self._informed().info
        index, _ = self.router.choose(prompt_ids, info.block_size if info else 16,
                                      [self._load(i) for i in live], lora)
        return index

    def _load(self, index: int) -> ReplicaLoad:
        client, polled = self.clients[index], self.polled[index]
        remote = polled.get("num_running", 0) + polled.get("num_waiting", 0)
        return ReplicaLoad(index, max(len(client.requests), remote),
                           polled.get("kv_blocks_free", 0))

    def _owner(self, request_id: str) -> EngineClient | None:
        for client in self.clients:
            if request_id in client.requests:
                return client
        return None

    def abort(self, request_id: str) -> None:
        owner = self._owner(request_id)
        if owner is not None:
            owner.abort(request_id)

    async def stop_strings(self, params: SamplingParams) -> StopStrings | None:
        return await self.clients[0].stop_strings(params)

    def abort_all(self, reason: str) -> None:
        for client in self.clients:
            client.abort_all(reason)

    async def stats(self, timeout: float = 1.0) -> dict[str, Any]:
        """The replicas' counts summed (what one engine of their size would report), and
        each replica's own under "replicas" (an empty map: that replica did not answer)."""
        answers = await asyncio.gather(*(c.stats(timeout) for c in self.clients))
        # A replica too busy to answer in time reports its last polled counts (at most
        # LOAD_POLL_S old), not zeros: its counters must not fall back between scrapes.
        per = [answer or (self.polled[i] if c.scheduler_alive else {})
               for i, (c, answer) in enumerate(zip(self.clients, answers))]
        total: dict[str, Any] = {key: sum(s.get(key, 0) for s in per) for key in _SUMMED}
        total["executor_alive"] = any(s.get("executor_alive") for s in per)
        for key in ("lora_running", "lora_waiting"):   # per adapter, summed
            if any(key in s for s in per):
                total[key] = {}
                for s in per:
                    for name, count in (s.get(key) or {}).items():
                        total[key][name] = total[key].get(name, 0) + count
        total["replicas"] = [{"replica": i, **s} for i, s in enumerate(per)]
        return total

    async def kv_map(self, timeout: float = 1.0, replica: int | None = None
                     ) -> dict[str, Any] | None:
        """One replica's page map (`replica`, else the first serving one)."""
        if replica is None:
            live = self._serving()
            replica = live[0] if live else 0
        snapshot = await self.clients[replica].kv_map(timeout)
        return None if snapshot is None else {**snapshot, "replica": replica}

    async def update_lora(self, name: str, path: str | None, timeout: float = 60.0
                          ) -> str | None:
        """On every replica: a load that fails on one is undone on the others."""
        clients = self._live()
        if not clients:
            return "no replica is serving; try again shortly"
        errors = await asyncio.gather(*(c.update_lora(name, path, timeout) for c in clients))
        failed = [(i, e) for i, e in enumerate(errors) if e is not None]
        if not failed:
            return None
        if path is not None:   # nothing half-loaded: unload where it worked
            await asyncio.gather(*(c.update_lora(name, None, timeout)
                                   for c, e in zip(clients, errors) if e is None))
        return "; ".join(dict.fromkeys(e for _, e in failed))

    # ---- load ---------------------------------------------------------------------------

    async def _poll_load(self) -> None:
        while True:
            per = await asyncio.gather(*(c.stats(LOAD_POLL_S) for c in self.clients))
            for index, (client, stats) in enumerate(zip(self.clients, per)):
                if stats or not client.scheduler_alive:   # keep the last on a late answer
                    self.polled[index] = stats
                serving = client.engine_alive
                if serving and not self.serving[index] and self.served[index]:
                    # Back after being seen down: its cache may have restarted empty. Its
                    # first start forgets nothing: requests may have been routed to it
                    # (the gateways read engine_alive directly) before this poll saw it.
                    log.info("replica %d serves again", index)
                    self.router.forget_replica(index)
                elif self.serving[index] and not serving:
                    log.warning("replica %d stopped serving: %s", index, client.dead_reason())
                self.serving[index] = serving
                self.served[index] = self.served[index] or serving
            await asyncio.sleep(LOAD_POLL_S)
