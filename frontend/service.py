"""The frontend process: text in, text out.

It loads the tokenizer, links to the scheduler (engine client) and serves clients through
its gateways: the ZeroMQ socket the SDK uses and, when a port is given, the OpenAI-compatible
HTTP API with /metrics and the chat page.
"""

from __future__ import annotations

import asyncio
import logging
import signal
from dataclasses import dataclass

import zmq.asyncio

from frontend.engine_client import EngineClient
from frontend.tokenizer import load_tokenizer
from frontend.zmq_gateway import ZmqGateway

log = logging.getLogger("folio.frontend")


@dataclass(frozen=True)
class FrontendConfig:
    model: str                 # directory holding the tokenizer files
    client_address: str
    scheduler_address: str
    host: str = "127.0.0.1"
    port: int | None = None    # HTTP API port; None: ZeroMQ only
    served_model_name: str | None = None
    api_key: str | None = None


class FrontendService:
    def __init__(self, config: FrontendConfig) -> None:
        self.config = config
        self.tokenizer = load_tokenizer(config.model)
        self.ctx = zmq.asyncio.Context()
        self.engine = EngineClient(self.tokenizer, config.scheduler_address, self.ctx)
        self.gateway = ZmqGateway(self.engine, config.client_address, self.ctx)
        self.stopped = asyncio.Event()

    async def run(self) -> None:
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, self.stopped.set)
        log.info("frontend %s: clients connect to %s", self.engine.frontend_id,
                 self.config.client_address)
        coroutines = [*self.engine.tasks(), self.gateway.serve()]
        if self.config.port is not None:
            from frontend.http_server import serve_http

            coroutines.append(serve_http(self.engine, self.config, self.stopped))
        tasks = [asyncio.create_task(c) for c in coroutines]
        await self.stopped.wait()
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        self.gateway.close()
        self.engine.close()
        self.ctx.term()


def serve_frontend(config: FrontendConfig) -> None:
    async def main() -> None:
        await FrontendService(config).run()

    try:
        import uvloop
    except ImportError:   # uvloop is optional off Linux
        asyncio.run(main())
    else:
        uvloop.run(main())
