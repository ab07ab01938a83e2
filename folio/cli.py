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
from pathlib import Path
from typing import Any

from folio.placement import PLACEMENTS
from folio.flags import (HelpFormatter, add_config_args, config_flags, config_values,
                         flag_name)
from folio.shared.config import (CURVE_KEYS_HELP, MAX_REQUESTS_PER_CLIENT,
                           MAX_REQUESTS_PER_CLIENT_HELP, SHUTDOWN_HELP, SHUTDOWN_TIMEOUT_S,
                           EngineConfig, SchedulingPolicy, SettingError)

ROLES = ("frontend", "scheduler", "executor")
LOG_LEVELS = ("DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL")
def add_engine_args(parser: argparse.ArgumentParser) -> None:
    """Every EngineConfig field (but the model) as a --flag, with its default."""
    add_config_args(parser, EngineConfig, skip=("model",))


def engine_config(args: argparse.Namespace, model: str) -> EngineConfig:
    return EngineConfig(model=model, **config_values(args, EngineConfig, skip=("model",)))


def engine_flags(config: EngineConfig) -> list[str]:
    """The command-line form of an EngineConfig (without --model)."""
    return config_flags(config, skip=("model",))


def scheduler_args_of_serve() -> tuple[str, ...]:
    """The SchedulerServiceConfig fields `folio serve` takes from flags of its own: the
    policy comes with the engine's flags, addresses from the run directory, CURVE keys and
    the shutdown timeout from flags every role shares."""
    return (*(f.name for f in dataclasses.fields(SchedulingPolicy)), "frontend_address",
            "executor_address", "curve_keys", "shutdown_timeout_s", "insecure_transport")


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
                        help="require 'Authorization: Bearer KEY' on /v1 routes and /metrics "
                        "(a flag shows in `ps`: prefer FOLIO_API_KEY or --api-key-file)")
    parser.add_argument("--api-key-file", default=None, metavar="FILE",
                        help="read the API key from FILE (its first line)")
    parser.add_argument("--metrics-public", action="store_true",
                        help="serve /metrics without the API key")
    parser.add_argument("--tool-call-parser", default=None, choices=("hermes", "llama3_json"),
                        help="read tool calls out of answers in this format, for chat "
                        "requests with tools and tool_choice auto (default: auto refused)")
    parser.add_argument("--allowed-hosts", default=None, metavar="NAMES",
                        help="Host header names HTTP answers, comma-separated, or '*' for any "
                        "(default: on a loopback --host only localhost, 127.0.0.1 and ::1)")


def add_security_args(parser: argparse.ArgumentParser) -> None:
    from folio.shared.transport import INSECURE_HELP

    parser.add_argument("--curve-keys", default=None, metavar="DIR", help=CURVE_KEYS_HELP)
    parser.add_argument("--insecure-transport", action="store_true", help=INSECURE_HELP)


def add_client_limit_args(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--max-requests-per-client", type=int,
                        default=MAX_REQUESTS_PER_CLIENT, metavar="N",
                        help=MAX_REQUESTS_PER_CLIENT_HELP)


def add_shutdown_args(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--shutdown-timeout", type=float, default=SHUTDOWN_TIMEOUT_S,
                        help=SHUTDOWN_HELP)


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
        if not env_settable(action) or action.default is argparse.SUPPRESS:
            continue   # a SUPPRESS default: the flag repeats the main parser's (--log-level)
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

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        kwargs.setdefault("formatter_class", HelpFormatter)
        super().__init__(*args, **kwargs)

    def parse_known_args(self, args=None, namespace=None):
        apply_env_defaults(self)
        return super().parse_known_args(args, namespace)

    def error(self, message: str):   # one line, not the whole usage
        self.exit(2, f"{self.prog}: error: {message} (`{self.prog} --help` lists the flags)\n")


def build_parser() -> argparse.ArgumentParser:
    parser = _EnvParser(
        prog="folio", description="Folio LLM serving engine. Every --flag can also be set "
        "as the environment variable FOLIO_<FLAG>, e.g. FOLIO_CURVE_KEYS=/keys.")
    from folio.scheduler.service import SchedulerServiceConfig

    add_log_level(parser, "INFO")
    sub = parser.add_subparsers(dest="command", required=True)

    serve = sub.add_parser("serve", help="start frontend, scheduler and executor")
    serve.add_argument("--model", help="checkpoint directory (default: the built-in model)")
    serve.add_argument("--zmq-address", help="where clients connect (default: ipc:// socket "
                       "in a private run directory), e.g. tcp://127.0.0.1:5555")
    serve.add_argument("--executor-restarts", type=int, default=3,
                       help="restart a crashed executor this many times, then exit non-zero")
    serve.add_argument("--data-parallel-size", type=int, default=1,
                       help="replicas: scheduler+executor pairs, each with its own KV pool, "
                       "that the frontend routes requests to (by prefix, then load)")
    add_http_args(serve)
    add_client_limit_args(serve)
    add_config_args(serve, SchedulerServiceConfig, skip=scheduler_args_of_serve())
    serve.add_argument("--cpu-placement", choices=PLACEMENTS, default="auto",
                       help="which cores each process may use when the executor runs on "
                       "CPU: split (frontend and scheduler on one core of their own), shared, "
                       "off; auto: split on CPU, off with a GPU")
    add_shutdown_args(serve)
    add_security_args(serve)
    add_engine_args(serve)

    frontend = sub.add_parser("frontend", help="run the tokenizing frontend")
    frontend.add_argument("--model", help="directory with the tokenizer files (default: "
                          "the built-in model)")
    frontend.add_argument("--client-address", required=True,
                          help="where SDK clients connect (this process binds it)")
    frontend.add_argument("--scheduler-address", required=True,
                          help="the scheduler's frontend address")
    add_http_args(frontend, default_port=None)
    add_client_limit_args(frontend)
    add_shutdown_args(frontend)
    add_security_args(frontend)
    frontend.add_argument("--client-curve", action=argparse.BooleanOptionalAction,
                          default=True, help="with --curve-keys: SDK clients need keys too "
                          "(--no-client-curve leaves the client port plain)")

    scheduler = sub.add_parser("scheduler", help="run the CPU-only scheduler")
    add_config_args(scheduler, SchedulerServiceConfig)

    executor = sub.add_parser("executor", help="run the model executor")
    executor.add_argument("--model", help="checkpoint directory (default: the built-in model)")
    executor.add_argument("--scheduler-address", required=True,
                          help="the scheduler's executor address")
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
    probe.add_argument("--timeout", type=float, default=3.0,
                       help="seconds to wait for an answer")
    add_security_args(probe)
    from folio.sim_report import add_simulate_args

    add_simulate_args(sub.add_parser("simulate", help="replay a request trace through the "
                                     "real scheduler: paged vs contiguous reservation"))
    for role_parser in sub.choices.values():
        add_log_level(role_parser, argparse.SUPPRESS)
    return parser


def add_log_level(parser: argparse.ArgumentParser, default: str) -> None:
    parser.add_argument("--log-level", type=str.upper, choices=LOG_LEVELS, default=default,
                        help="how much each process logs (default: INFO, or the level "
                        "given before the subcommand)" if default is argparse.SUPPRESS
                        else "how much each process logs (before or after the subcommand)")


def api_key(args: argparse.Namespace) -> str | None:
    """--api-key (or FOLIO_API_KEY), or the first line of --api-key-file."""
    if not args.api_key_file:
        return args.api_key
    if args.api_key:
        sys.exit("folio: give --api-key (FOLIO_API_KEY) or --api-key-file, not both")
    try:
        key = Path(args.api_key_file).read_text(encoding="utf-8").strip().splitlines()
    except (OSError, UnicodeDecodeError) as error:
        sys.exit(f"folio: cannot read --api-key-file: {error}")
    if not key or not key[0].strip():
        sys.exit(f"folio: --api-key-file {args.api_key_file} is empty")
    return key[0].strip()


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
    logging.basicConfig(level=args.log_level,
                        format=f"%(asctime)s folio-{role} %(levelname)s %(message)s")
    try:
        return run_role(role, args)
    except SettingError as error:   # raised before any process or socket starts
        print(f"folio {role}: error: {setting_flag(error.setting)} {error.problem}",
              file=sys.stderr)
        return 2


def setting_flag(name: str) -> str:
    """The flag of a config field (`executor_timeout_s` is --executor-timeout)."""
    from folio.scheduler.service import SchedulerServiceConfig

    for cls in (EngineConfig, SchedulerServiceConfig):
        for spec in dataclasses.fields(cls):
            if spec.name == name:
                return "--" + flag_name(spec)
    return "--" + name.replace("_", "-")


def check_http(args: argparse.Namespace) -> None:
    if args.port is not None and not 0 <= args.port <= 65535:
        raise SettingError("port", f"must be in 0..65535, got {args.port}")
    if args.shutdown_timeout < 0:
        raise SettingError("shutdown_timeout", f"must be >= 0 seconds, got "
                           f"{args.shutdown_timeout}")
    if args.max_requests_per_client < 1:
        raise SettingError("max_requests_per_client", f"must be >= 1, got "
                           f"{args.max_requests_per_client}")


def check_bind(**addresses: str) -> None:
    """Addresses this process binds: a scheme Folio speaks, no wildcard unless allowed."""
    from folio.shared.transport import check_bind_address

    for name, address in addresses.items():
        try:
            check_bind_address(address)
        except ValueError as error:
            raise SettingError(name, str(error)) from None


def check_links(curve: bool, insecure: bool, executor_link: tuple[str, ...] = (),
                **addresses: str) -> None:
    """No unauthenticated TCP link others could use, unless --insecure-transport."""
    from folio.shared.transport import insecure_link

    if insecure:
        return
    for name, value in addresses.items():
        for address in value.split(","):   # a frontend may list several schedulers
            problem = insecure_link(address.strip(), curve, name in executor_link)
            if problem is not None:
                raise SettingError(name, problem)


def run_role(role: str, args: argparse.Namespace) -> int:
    if role == "serve":
        from folio.serve import serve

        return serve(args)
    if role == "keys":
        from folio.shared.security import generate_keys

        written = generate_keys(args.curve_keys, args.force, tuple(args.client))
        for path in written:
            print(f"wrote {path}")
        print(f"keys in {args.curve_keys}" + ("" if written else " (kept)"))
        return 0
    if role == "simulate":
        from folio.sim_report import run_simulate

        return run_simulate(args)
    if role == "probe":
        from folio.probe import probe

        return probe(args.role, args.address, args.timeout, args.curve_keys)
    set_role_title(role)
    if role == "frontend":
        from folio.frontend.service import FrontendConfig, serve_frontend

        check_http(args)
        check_bind(client_address=args.client_address)
        check_links(bool(args.curve_keys), args.insecure_transport,
                    scheduler_address=args.scheduler_address)
        check_links(bool(args.curve_keys) and args.client_curve, args.insecure_transport,
                    client_address=args.client_address)
        model = resolve_model(args.model)
        if not Path(model).is_dir():
            raise SettingError("model", f"{model}: no such directory")
        serve_frontend(FrontendConfig(model=model,
                                      client_address=args.client_address,
                                      scheduler_address=args.scheduler_address,
                                      host=args.host, port=args.port or None,
                                      served_model_name=args.served_model_name,
                                      api_key=api_key(args),
                                      metrics_public=args.metrics_public,
                                      tool_call_parser=args.tool_call_parser,
                                      allowed_hosts=args.allowed_hosts,
                                      shutdown_timeout_s=args.shutdown_timeout,
                                      max_requests_per_client=args.max_requests_per_client,
                                      curve_keys=args.curve_keys,
                                      client_curve=args.client_curve))
    elif role == "scheduler":
        from folio.scheduler.service import SchedulerService, SchedulerServiceConfig

        config = SchedulerServiceConfig(**config_values(args, SchedulerServiceConfig))
        check_bind(frontend_address=config.frontend_address,
                   executor_address=config.executor_address)
        check_links(bool(config.curve_keys), config.insecure_transport, ("executor_address",),
                    frontend_address=config.frontend_address,
                    executor_address=config.executor_address)
        SchedulerService(config).run()
    elif role == "executor":
        from folio.preflight import check_engine

        check_links(bool(args.curve_keys), args.insecure_transport, ("scheduler_address",),
                    scheduler_address=args.scheduler_address)
        config = engine_config(args, resolve_model(args.model))
        check_engine(config)   # before torch is imported
        from folio.executor.service import ExecutorService, ExecutorServiceConfig

        try:
            service = ExecutorService(ExecutorServiceConfig(args.scheduler_address, config,
                                                            args.curve_keys))
        except ValueError as error:   # e.g. --device cuda without one, tensors that misfit
            print(f"folio executor: error: {error}", file=sys.stderr)
            return 2   # `folio serve` does not restart it: it would fail the same way
        service.run()
    return 0


if __name__ == "__main__":
    sys.exit(main())
