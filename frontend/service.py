"""The frontend process: text in, text out.

It loads the tokenizer, links to the scheduler (engine client) and serves clients through
its gateways: the ZeroMQ socket the SDK uses and, when a port is given, the OpenAI-compatible
HTTP API with /metrics and the chat page.

SIGTERM drains: new requests are refused at once (HTTP 503 with Retry-After, ZeroMQ error
`shutting_down`), running ones may finish within `shutdown_timeout_s`, the rest are aborted,
and the process exits 0. A second SIGTERM skips the wait.
"""

from __future__ import annotations

import asyncio
import logging
import signal
from dataclasses import dataclass

import zmq.asyncio

from folio.frontend.reasoning.parsers import check_parser
from folio.frontend.engine_client import EngineClient
from folio.frontend.engine_api import Engine
from folio.shared.hf_tokenizer import load_tokenizer
from folio.frontend.zmq_gateway import ClientLimits, ZmqGateway
from folio.shared.service_settings import (ClientLimitSettings, FrontendLinks, HttpSettings,
                                          ShutdownSettings, TransportSettings)
from folio.shared.security import FRONTEND, load_keys, start_authenticator, stop_authenticator

log = logging.getLogger("folio.frontend")


@dataclass(frozen=True, kw_only=True)
class FrontendConfig(FrontendLinks, HttpSettings, ShutdownSettings, ClientLimitSettings,
                     TransportSettings):
    """`folio frontend`'s settings, each declared once in its group (shared/service_settings.py);
    folio/checks.py builds it after the cross-setting checks, with api_key read from its
    variable or file and model resolved to a directory."""


def scheduler_addresses(value: str) -> list[str]:
    """--scheduler-address: one scheduler, or data-parallel replicas' separated by commas."""
    addresses = [a.strip() for a in value.split(",") if a.strip()]
    if not addresses:
        raise ValueError("scheduler_address must name at least one scheduler")
    return addresses


class FrontendService:
    def __init__(self, config: FrontendConfig) -> None:
        self.config = config
        keys = None
        if config.curve_keys:
            # Its own keypair to the scheduler; the SDK clients' allow-list on its port.
            keys = load_keys(config.curve_keys, server=config.client_curve, client=True,
                             peer=FRONTEND)
        self.tokenizer = load_tokenizer(config.model)
        check_parser(getattr(config, "reasoning_parser", None), self.tokenizer)   # before start
        self.ctx = zmq.asyncio.Context()
        client_keys = keys if config.client_curve else None
        self.auth = start_authenticator(self.ctx, client_keys)   # before the gateway binds
        addresses = scheduler_addresses(config.scheduler_address)
        if len(addresses) > 1:   # data-parallel replicas: one engine client each
            from folio.frontend.replicas import Replicas

            self.engine: Engine = Replicas(self.tokenizer, addresses, self.ctx, keys)
        else:
            self.engine = EngineClient(self.tokenizer, addresses[0], self.ctx, keys)
        self.gateway = ZmqGateway(self.engine, config.client_address, self.ctx, client_keys,
                                  ClientLimits(max_requests=config.max_requests_per_client,
                                               priority_floor=config.priority_floor))
        self.stopped = asyncio.Event()     # first signal: drain
        self.hurry = asyncio.Event()       # second signal: stop waiting for running requests
        self.http_stop = asyncio.Event()   # the HTTP server stops after the drain

    def _on_signal(self) -> None:
        if self.stopped.is_set():
            self.hurry.set()
        self.stopped.set()

    async def run(self) -> None:
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, self._on_signal)
        log.info("frontend %s: clients connect to %s", self.engine.frontend_id,
                 self.config.client_address)
        tasks = [asyncio.create_task(c) for c in [*self.engine.tasks(), self.gateway.serve()]]
        if self.config.port is not None:
            from folio.frontend.http.server import serve_http

            tasks.append(asyncio.create_task(
                serve_http(self.engine, self.config, self.http_stop)))
        await self.stopped.wait()
        await self._drain()
        self.http_stop.set()
        if self.config.port is not None:   # uvicorn ends the responses it is sending, then stops
            await asyncio.wait(tasks[-1:], timeout=5)
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        self.gateway.close()
        self.engine.close()
        stop_authenticator(self.auth)
        self.ctx.term()

    async def _drain(self) -> None:
        engine = self.engine
        engine.draining = True
        timeout = self.config.shutdown_timeout_s
        log.info("draining: refusing new requests; %d running may finish within %.0f s",
                 len(engine.requests), timeout)
        deadline = asyncio.get_running_loop().time() + timeout
        while engine.requests and not self.hurry.is_set():
            left = deadline - asyncio.get_running_loop().time()
            if left <= 0:
                break
            try:
                async with asyncio.timeout(min(left, 0.05)):
                    await self.hurry.wait()
            except TimeoutError:
                pass
        if engine.requests:
            log.warning("shutdown: aborting %d request(s) still running", len(engine.requests))
            engine.abort_all("the server is shutting down; the request was aborted")
            await asyncio.sleep(0.2)   # let the error replies and aborts leave


def serve_frontend(config: FrontendConfig) -> None:
    async def main() -> None:
        await FrontendService(config).run()

    try:
        import uvloop
    except ImportError:   # uvloop is optional off Linux
        asyncio.run(main())
    else:
        uvloop.run(main())
