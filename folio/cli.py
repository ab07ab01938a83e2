"""The `folio` command: serve (all three processes), or one role on its own.

Every --flag may also come from the environment as FOLIO_<FLAG> (dashes as underscores,
e.g. FOLIO_CURVE_KEYS for --curve-keys); a flag on the command line wins, an empty
variable counts as unset.
"""

from __future__ import annotations

import argparse
import dataclasses
import logging
import os
import sys
from typing import Any

from folio.placement import PLACEMENTS
from shared.config import (ATTENTION_BACKENDS, DEVICES, DTYPES, LINEAR_BACKENDS,
                           PREEMPTION_MODES, EngineConfig)

ROLES = ("frontend", "scheduler", "executor")
_CHOICES = {"dtype": DTYPES, "device": DEVICES, "attention_backend": ATTENTION_BACKENDS,
            "linear_backend": LINEAR_BACKENDS, "preemption_mode": PREEMPTION_MODES}
_HELP = {
    "tokenizer": "tokenizer directory (default: the model directory)",
    "num_kv_blocks": "KV blocks in the pool (default: sized from memory)",
    "max_model_len": "context limit (default: the model's max_position_embeddings)",
    "cpu_threads": "executor's torch threads on CPU (default: every core it may use, less "
                   "one per other Folio process placed on the machine)",
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
    parser.add_argument("--served-model-name", nargs="+", default=None, metavar="NAME",
                        help="the model name(s) clients use; answers report the first "
                        "(default: the checkpoint directory's name)")
    parser.add_argument("--api-key", default=None,
                        help="require 'Authorization: Bearer KEY' on /v1 routes and /metrics")
    parser.add_argument("--metrics-public", action="store_true",
                        help="serve /metrics without the API key")


def add_security_args(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--curve-keys", default=None, metavar="DIR",
                        help="CURVE keys directory (`folio keys`): every ZeroMQ socket "
                        "encrypts and refuses peers without the keys (default: no CURVE)")


def add_shutdown_args(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--shutdown-timeout", type=float, default=30.0,
                        help="on SIGTERM, seconds running requests may take to finish "
                        "before they are aborted")


def add_scheduling_args(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--async-scheduling", action=argparse.BooleanOptionalAction,
                        default=True, help="keep one step in flight: send the plan of step "
                        "N+1 before the result of step N arrives, hiding the hop")


_TRUE, _FALSE = ("1", "true", "yes", "on"), ("0", "false", "no", "off")


def env_name(dest: str) -> str:
    return "FOLIO_" + dest.upper()


def env_settable(action: argparse.Action) -> bool:
    """Single-valued flags (not --help, not repeatable ones) can come from FOLIO_*."""
    return (bool(action.option_strings) and action.dest not in ("help", argparse.SUPPRESS)
            and not isinstance(action, argparse._AppendAction))


def apply_env_defaults(parser: argparse.ArgumentParser) -> None:
    """FOLIO_<DEST> in the environment becomes the default of --<dest> (and satisfies a
    required flag); the command line still wins."""
    for action in parser._actions:
        if not env_settable(action):
            continue
        name = env_name(action.dest)
        raw = os.environ.get(name, "")
        if raw == "":
            continue
        try:
            if isinstance(action, (argparse.BooleanOptionalAction,
                                   argparse._StoreTrueAction)):
                if raw.lower() not in _TRUE + _FALSE:
                    raise ValueError("expected 1/0, true/false, yes/no or on/off")
                value: Any = raw.lower() in _TRUE
            else:
                value = action.type(raw) if action.type else raw
            if action.choices is not None and value not in action.choices:
                raise ValueError(f"expected one of {', '.join(map(str, action.choices))}")
        except ValueError as error:
            parser.error(f"environment variable {name}={raw!r}: {error}")
        action.default = value
        action.required = False


class _EnvParser(argparse.ArgumentParser):
    """Reads FOLIO_* defaults when it parses: a bad variable is reported by the command
    that uses it (subcommands are parsers of this class too)."""

    def parse_known_args(self, args=None, namespace=None):
        apply_env_defaults(self)
        return super().parse_known_args(args, namespace)


def build_parser() -> argparse.ArgumentParser:
    parser = _EnvParser(
        prog="folio", description="Folio LLM serving engine. Every --flag can also be set "
        "as the environment variable FOLIO_<FLAG>, e.g. FOLIO_CURVE_KEYS=/keys.")
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
    serve.add_argument("--max-queued-tokens", type=int, default=None,
                       help="... or past this many prompt tokens waiting")
    serve.add_argument("--cpu-placement", choices=PLACEMENTS, default="auto",
                       help="which cores each process may use when the executor runs on "
                       "CPU: split (frontend and scheduler on one core of their own), shared, "
                       "off; auto: split on CPU, off with a GPU")
    add_scheduling_args(serve)
    add_shutdown_args(serve)
    add_security_args(serve)
    add_engine_args(serve)

    frontend = sub.add_parser("frontend", help="run the tokenizing frontend")
    frontend.add_argument("--model", help="directory with the tokenizer files")
    frontend.add_argument("--client-address", required=True)
    frontend.add_argument("--scheduler-address", required=True)
    add_http_args(frontend, default_port=None)
    add_shutdown_args(frontend)
    add_security_args(frontend)
    frontend.add_argument("--client-curve", action=argparse.BooleanOptionalAction,
                          default=True, help="with --curve-keys: SDK clients need keys too "
                          "(--no-client-curve leaves the client port plain)")

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
    scheduler.add_argument("--max-queued-tokens", type=int, default=None,
                           help="... or past this many prompt tokens waiting")
    scheduler.add_argument("--executor-timeout", type=float, default=2.0,
                           help="seconds without an executor heartbeat before it is dead")
    scheduler.add_argument("--step-timeout", type=float, default=60.0,
                           help="seconds a step may take before the executor is declared hung")
    add_scheduling_args(scheduler)
    add_shutdown_args(scheduler)
    add_security_args(scheduler)

    executor = sub.add_parser("executor", help="run the model executor")
    executor.add_argument("--model", help="checkpoint directory (default: the built-in model)")
    executor.add_argument("--scheduler-address", required=True)
    add_security_args(executor)
    add_engine_args(executor)

    keys = sub.add_parser("keys", help="write CURVE keypairs for `--curve-keys` (mode 0700)")
    keys.add_argument("--dir", dest="curve_keys", required=True, metavar="DIR",
                      help="the keys directory (kept if it already holds keys)")
    keys.add_argument("--client", action="append", default=[], metavar="NAME",
                      help="also write and authorize the client keypair NAME (repeatable), "
                      "e.g. one per SDK user")
    keys.add_argument("--force", action="store_true", help="replace existing keypairs")

    probe = sub.add_parser("probe", help="health check for one role; exit 0 when healthy")
    probe.add_argument("role", choices=ROLES)
    probe.add_argument("address", help="frontend: its http://.../health URL or its client "
                       "address; scheduler and executor: the scheduler's frontend address "
                       "(the executor is healthy when the scheduler has it attached)")
    probe.add_argument("--timeout", type=float, default=3.0)
    add_security_args(probe)
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
    if role == "keys":
        from shared.security import generate_keys

        written = generate_keys(args.curve_keys, args.force, tuple(args.client))
        for path in written:
            print(f"wrote {path}")
        print(f"keys in {args.curve_keys}" + ("" if written else " (kept)"))
        return 0
    if role == "probe":
        from folio.probe import probe

        return probe(args.role, args.address, args.timeout, args.curve_keys)
    set_role_title(role)
    if role == "frontend":
        from frontend.service import FrontendConfig, serve_frontend

        serve_frontend(FrontendConfig(model=resolve_model(args.model),
                                      client_address=args.client_address,
                                      scheduler_address=args.scheduler_address,
                                      host=args.host, port=args.port or None,
                                      served_model_name=args.served_model_name,
                                      api_key=args.api_key,
                                      metrics_public=args.metrics_public,
                                      shutdown_timeout_s=args.shutdown_timeout,
                                      curve_keys=args.curve_keys,
                                      client_curve=args.client_curve))
    elif role == "scheduler":
        from scheduler.service import SchedulerService, SchedulerServiceConfig

        SchedulerService(SchedulerServiceConfig(
            frontend_address=args.frontend_address, executor_address=args.executor_address,
            max_num_seqs=args.max_num_seqs, max_num_batched_tokens=args.max_num_batched_tokens,
            enable_chunked_prefill=args.enable_chunked_prefill,
            enable_prefix_caching=args.enable_prefix_caching,
            preemption_mode=args.preemption_mode,
            max_queued_requests=args.max_queued_requests,
            max_queued_tokens=args.max_queued_tokens,
            max_logprobs=args.max_logprobs, max_n=args.max_n,
            executor_timeout_s=args.executor_timeout, step_timeout_s=args.step_timeout,
            shutdown_timeout_s=args.shutdown_timeout, curve_keys=args.curve_keys,
            async_scheduling=args.async_scheduling)).run()
    elif role == "executor":
        from executor.service import ExecutorService, ExecutorServiceConfig

        config = engine_config(args, resolve_model(args.model))
        ExecutorService(ExecutorServiceConfig(args.scheduler_address, config,
                                              args.curve_keys)).run()
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
