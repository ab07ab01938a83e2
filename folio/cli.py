"""The `folio` command: serve (all three processes), or one role on its own."""

from __future__ import annotations

import argparse
import dataclasses
import logging
import sys
from typing import Any

from shared.config import ATTENTION_BACKENDS, DEVICES, DTYPES, PREEMPTION_MODES, EngineConfig

ROLES = ("frontend", "scheduler", "executor")
_CHOICES = {"dtype": DTYPES, "device": DEVICES, "attention_backend": ATTENTION_BACKENDS,
            "preemption_mode": PREEMPTION_MODES}
_HELP = {
    "tokenizer": "tokenizer directory (default: the model directory)",
    "num_kv_blocks": "KV blocks in the pool (default: sized from memory)",
    "max_model_len": "context limit (default: the model's max_position_embeddings)",
}


def add_engine_args(parser: argparse.ArgumentParser) -> None:
    """Every EngineConfig field (but the model) as a --flag, with its default."""
    for spec in dataclasses.fields(EngineConfig):
        if spec.name == "model":
            continue
        flag = "--" + spec.name.replace("_", "-")
        default = spec.default
        if isinstance(default, bool):
            parser.add_argument(flag, action=argparse.BooleanOptionalAction, default=default)
            continue
        kind = {int: int, float: float, str: str}.get(type(default), None)
        if default is None:   # optional fields: the annotation says "int | None" or "str | None"
            kind = int if str(spec.type).startswith("int") else str
        parser.add_argument(flag, type=kind, default=default, choices=_CHOICES.get(spec.name),
                            help=_HELP.get(spec.name))


def engine_config(args: argparse.Namespace, model: str) -> EngineConfig:
    values = {f.name: getattr(args, f.name) for f in dataclasses.fields(EngineConfig)
              if f.name != "model"}
    return EngineConfig(model=model, **values)


def resolve_model(model: str | None) -> str:
    if model:
        return model
    from folio.default_model import default_model_path

    return str(default_model_path())


def add_http_args(parser: argparse.ArgumentParser, default_port: int | None = 8000) -> None:
    parser.add_argument("--host", default="127.0.0.1", help="HTTP API interface")
    parser.add_argument("--port", type=int, default=default_port,
                        help="HTTP API port (OpenAI-compatible); 0 turns HTTP off"
                        if default_port else "HTTP API port (default: no HTTP)")
    parser.add_argument("--served-model-name", default=None,
                        help="the model name clients use (default: the model path)")
    parser.add_argument("--api-key", default=None,
                        help="require 'Authorization: Bearer KEY' on /v1 routes")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="folio", description="Folio LLM serving engine")
    parser.add_argument("--log-level", default="INFO")
    sub = parser.add_subparsers(dest="command", required=True)

    serve = sub.add_parser("serve", help="start frontend, scheduler and executor")
    serve.add_argument("--model", help="checkpoint directory (default: the built-in model)")
    serve.add_argument("--zmq-address", help="where clients connect (default: ipc:// socket "
                       "in a private run directory), e.g. tcp://127.0.0.1:5555")
    serve.add_argument("--executor-restarts", type=int, default=3,
                       help="restart a crashed executor this many times, then exit non-zero")
    add_http_args(serve)
    serve.add_argument("--max-queued-requests", type=int, default=None,
                       help="refuse new requests (queue full) past this many waiting")
    add_engine_args(serve)

    frontend = sub.add_parser("frontend", help="run the tokenizing frontend")
    frontend.add_argument("--model", help="directory with the tokenizer files")
    frontend.add_argument("--client-address", required=True)
    frontend.add_argument("--scheduler-address", required=True)
    add_http_args(frontend, default_port=None)

    scheduler = sub.add_parser("scheduler", help="run the CPU-only scheduler")
    scheduler.add_argument("--frontend-address", required=True)
    scheduler.add_argument("--executor-address", required=True)
    scheduler.add_argument("--max-num-seqs", type=int, default=256)
    scheduler.add_argument("--max-num-batched-tokens", type=int, default=2048)
    scheduler.add_argument("--enable-chunked-prefill", action=argparse.BooleanOptionalAction,
                           default=True)
    scheduler.add_argument("--enable-prefix-caching", action=argparse.BooleanOptionalAction,
                           default=True)
    scheduler.add_argument("--preemption-mode", choices=PREEMPTION_MODES,
                           default="recompute")
    scheduler.add_argument("--max-logprobs", type=int, default=20)
    scheduler.add_argument("--max-n", type=int, default=64)
    scheduler.add_argument("--max-queued-requests", type=int, default=None,
                           help="refuse new requests (queue full) past this many waiting")
    scheduler.add_argument("--executor-timeout", type=float, default=2.0,
                           help="seconds without an executor heartbeat before it is dead")
    scheduler.add_argument("--step-timeout", type=float, default=60.0,
                           help="seconds a step may take before the executor is declared hung")

    executor = sub.add_parser("executor", help="run the model executor")
    executor.add_argument("--model", help="checkpoint directory (default: the built-in model)")
    executor.add_argument("--scheduler-address", required=True)
    add_engine_args(executor)
    return parser


def set_role_title(role: str) -> None:
    """Make `ps` show folio-<role>, however the process was started."""
    title = f"folio-{role}"
    try:
        import setproctitle

        setproctitle.setproctitle(" ".join([title, *sys.argv[1:]]))
    except ImportError:
        pass
    try:   # the short name (comm) too, for `ps -e`, `top` and `pgrep`
        import ctypes

        ctypes.CDLL(None).prctl(15, title.encode()[:15], 0, 0, 0)   # PR_SET_NAME
    except (OSError, AttributeError):
        pass


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    role = args.command
    logging.basicConfig(level=args.log_level.upper(),
                        format=f"%(asctime)s folio-{role} %(levelname)s %(message)s")
    if role == "serve":
        from folio.serve import serve

        return serve(args)
    set_role_title(role)
    if role == "frontend":
        from frontend.service import FrontendConfig, serve_frontend

        serve_frontend(FrontendConfig(model=resolve_model(args.model),
                                      client_address=args.client_address,
                                      scheduler_address=args.scheduler_address,
                                      host=args.host, port=args.port or None,
                                      served_model_name=args.served_model_name,
                                      api_key=args.api_key))
    elif role == "scheduler":
        from scheduler.service import SchedulerService, SchedulerServiceConfig

        SchedulerService(SchedulerServiceConfig(
            frontend_address=args.frontend_address, executor_address=args.executor_address,
            max_num_seqs=args.max_num_seqs, max_num_batched_tokens=args.max_num_batched_tokens,
            enable_chunked_prefill=args.enable_chunked_prefill,
            enable_prefix_caching=args.enable_prefix_caching,
            preemption_mode=args.preemption_mode,
            max_queued_requests=args.max_queued_requests,
            max_logprobs=args.max_logprobs, max_n=args.max_n,
            executor_timeout_s=args.executor_timeout, step_timeout_s=args.step_timeout)).run()
    elif role == "executor":
        from executor.service import ExecutorService, ExecutorServiceConfig

        config = engine_config(args, resolve_model(args.model))
        ExecutorService(ExecutorServiceConfig(args.scheduler_address, config)).run()
    return 0


def engine_flags(config: EngineConfig) -> list[str]:
    """The command-line form of an EngineConfig (without --model)."""
    flags: list[str] = []
    for spec in dataclasses.fields(EngineConfig):
        value: Any = getattr(config, spec.name)
        if spec.name == "model" or value is None:
            continue
        flag = "--" + spec.name.replace("_", "-")
        if isinstance(value, bool):
            flags.append(flag if value else "--no-" + flag[2:])
        else:
            flags += [flag, str(value)]
    return flags


if __name__ == "__main__":
    sys.exit(main())
