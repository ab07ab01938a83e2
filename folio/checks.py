"""Every check across settings, in one place, run once per command before it starts any
process, binds any socket or reads any weight.

Each `check_<command>` makes the command's config dataclasses from the parsed arguments
(their fields' own checks run there, shared/settings.py), then checks what no single field
can: the model directory against the engine settings (folio/preflight.py), addresses this
process binds, links others could reach without CURVE, the API key's two sources, the ports
`folio serve` will bind. Each problem is a SettingError naming the setting; `folio` prints
it as one line naming the flag and exits 2.
"""

from __future__ import annotations

import argparse
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from folio.default_model import resolve_model
from folio.executor.quantization.gguf.file import (check_gguf_file, is_directory_or_gguf,
                                                   is_gguf)
from folio.flags import config_of, config_values
from folio.preflight import check_engine, check_ports_free
from folio.scheduler.service_config import SchedulerServiceConfig
from folio.command_settings import (SERVE_SCHEDULER_SKIP, ExecutorLinks, KeysSettings,
                            ProbeSettings, ServeSettings)
from folio.shared.config import EngineConfig, SettingError, policy_values
from folio.shared.kv_events_config import parse_kv_events_config
from folio.shared.service_settings import (ClientLimitSettings, FrontendLinks, HttpSettings,
                                           ShutdownSettings, TransportSettings)


@dataclass(frozen=True)
class ServePlan:
    """`folio serve`'s settings, checked: what the supervisor starts its processes with."""

    log_level: str
    serve: ServeSettings
    engine: EngineConfig          # its model resolved (the built-in one when none given)
    http: HttpSettings
    api_key: str | None           # from --api-key or --api-key-file
    limits: ClientLimitSettings
    scheduler: dict[str, Any]     # SchedulerServiceConfig's own fields, but the skipped ones
    shutdown: ShutdownSettings
    transport: TransportSettings

    def scheduler_config(self, frontend_address: str, executor_address: str,
                         replica: int | None = None) -> SchedulerServiceConfig:
        """`replica`: of several data-parallel replicas, which (its KV events get their own
        ports and its rank)."""
        own = dict(self.scheduler)
        if replica is not None and own.get("kv_events_config"):
            own["kv_events_config"] = parse_kv_events_config(
                own["kv_events_config"]).for_replica(replica).to_json()
        return SchedulerServiceConfig(
            **policy_values(self.engine), frontend_address=frontend_address,
            executor_address=executor_address, curve_keys=self.transport.curve_keys,
            shutdown_timeout_s=self.shutdown.shutdown_timeout_s, **own)


@dataclass(frozen=True)
class ExecutorPlan:
    scheduler_address: str | None   # None: --headless
    engine: EngineConfig
    curve_keys: str | None
    headless: bool = False


@dataclass(frozen=True)
class ProbePlan:
    probe: ProbeSettings
    curve_keys: str | None


def check_serve(args: argparse.Namespace) -> ServePlan | ExecutorPlan:
    serve = config_of(ServeSettings, args)
    http = config_of(HttpSettings, args)
    transport = config_of(TransportSettings, args)
    if serve.headless:   # a worker node: its ranks only, as `folio executor --headless`
        return check_headless_serve(args, serve, transport)
    plan = ServePlan(
        log_level=args.log_level, serve=serve,
        engine=config_of(EngineConfig, args, model=resolve_model(serve.model)),
        http=http, api_key=api_key(http), limits=config_of(ClientLimitSettings, args),
        scheduler=config_values(args, SchedulerServiceConfig, skip=SERVE_SCHEDULER_SKIP),
        shutdown=config_of(ShutdownSettings, args), transport=transport)
    plan.scheduler_config("ipc://checked", "ipc://checked")   # its own checks, before its
    check_engine(plan.engine)                                 # addresses exist
    check_nodes(plan.engine, False, transport)
    check_lora_names(plan.engine, http)
    if plan.engine.nnodes > 1 and serve.data_parallel_size > 1:
        raise SettingError("data_parallel_size", "with --nnodes > 1 is not supported: one "
                           "tensor-parallel group spans the nodes")
    if serve.zmq_address:
        check_bind(zmq_address=serve.zmq_address)
        check_links(bool(transport.curve_keys), transport.insecure_transport,
                    zmq_address=serve.zmq_address)
    check_ports_free(http.host, http.port, serve.zmq_address)
    return plan


def check_headless_serve(args: argparse.Namespace, serve: ServeSettings,
                         transport: TransportSettings) -> ExecutorPlan:
    """`folio serve --headless`: what a worker node takes of serve's settings (the model and
    the engine's); the ones only a node with processes of its own uses are refused."""
    for name in ("zmq_address", "data_parallel_size"):
        if getattr(serve, name) != ServeSettings.__dataclass_fields__[name].default:
            raise SettingError(name, "does not apply with --headless: a worker node runs "
                               "tensor-parallel ranks only")
    return _executor_plan(args, serve.model, None, True, transport)


def check_lora_names(engine: EngineConfig, http: HttpSettings) -> None:
    """An adapter is chosen by the request's model field: no adapter may take a name the
    base model answers to (docs/lora.md)."""
    from folio.frontend.openai.field_parsers import served_names

    if http.enable_lora_runtime_updates and not engine.enable_lora:
        raise SettingError("enable_lora_runtime_updates", "needs --enable-lora")
    if http.enable_lora_runtime_updates and engine.tensor_parallel_size > 1:
        raise SettingError("enable_lora_runtime_updates", "not with tensor_parallel_size > 1 "
                           "(every rank would have to load each adapter); list the adapters "
                           "in --lora-modules")
    names = set(served_names(http.served_model_name, engine.model))
    for name in engine.lora_paths:
        if name in names:
            raise SettingError("lora_modules", f"adapter name {name!r} is the base model's "
                               "name (--served-model-name)")


def check_frontend(args: argparse.Namespace):
    from folio.frontend.service import FrontendConfig

    links = config_of(FrontendLinks, args)
    http = config_of(HttpSettings, args)
    transport = config_of(TransportSettings, args)
    check_bind(client_address=links.client_address)
    curve, insecure = bool(transport.curve_keys), transport.insecure_transport
    check_links(curve, insecure, scheduler_address=links.scheduler_address)
    check_links(curve and links.client_curve, insecure, client_address=links.client_address)
    model = resolve_model(links.model)
    if not is_directory_or_gguf(model):
        raise SettingError("model", f"{model}: no such directory or GGUF file")
    _check_gguf_header(model)
    return FrontendConfig(
        **{**asdict(links), "model": model},
        **{**asdict(http), "port": http.port or None, "api_key": api_key(http),
           "api_key_file": None},   # read into api_key
        **asdict(config_of(ShutdownSettings, args)),
        **asdict(config_of(ClientLimitSettings, args)), **asdict(transport))


def _check_gguf_header(model: str) -> None:
    """The frontend reads its tokenizer from a GGUF file through gguf.GGUFReader, which
    allocates what a crafted header declares: the bounded header checks come first."""
    if not is_gguf(model):
        return
    try:
        check_gguf_file(Path(model))
    except ValueError as error:
        raise SettingError("model", f"{model}: {error}") from None


def check_scheduler(args: argparse.Namespace) -> SchedulerServiceConfig:
    config = config_of(SchedulerServiceConfig, args)
    check_bind(frontend_address=config.frontend_address,
               executor_address=config.executor_address)
    check_links(bool(config.curve_keys), config.insecure_transport, ("executor_address",),
                frontend_address=config.frontend_address,
                executor_address=config.executor_address)
    return config


def check_executor(args: argparse.Namespace) -> ExecutorPlan:
    links = config_of(ExecutorLinks, args)
    transport = config_of(TransportSettings, args)
    if links.scheduler_address is None and not links.headless:
        raise SettingError("scheduler_address", "is required (unless --headless)")
    if links.scheduler_address is not None:
        check_links(bool(transport.curve_keys), transport.insecure_transport,
                    ("scheduler_address",), scheduler_address=links.scheduler_address)
    return _executor_plan(args, links.model, links.scheduler_address, links.headless,
                          transport)


def _executor_plan(args: argparse.Namespace, model: str | None,
                   scheduler_address: str | None, headless: bool,
                   transport: TransportSettings) -> ExecutorPlan:
    """The engine's settings checked, for `folio executor` and `folio serve --headless`."""
    engine = config_of(EngineConfig, args, model=resolve_model(model))
    check_engine(engine)   # before torch is imported
    check_nodes(engine, headless, transport)
    return ExecutorPlan(scheduler_address, engine, transport.curve_keys, headless)


def check_nodes(engine: EngineConfig, headless: bool, transport: TransportSettings) -> None:
    """Multi-node tensor parallelism: a layout the ranks can take, node 0 reachable, and
    plans between nodes over CURVE only."""
    nnodes, node, size = engine.nnodes, engine.node_rank, engine.tensor_parallel_size
    if node >= nnodes:
        raise SettingError("node_rank", f"{node} must be below --nnodes {nnodes}")
    if size % nnodes:
        raise SettingError("nnodes", f"{nnodes} does not divide --tensor-parallel-size "
                           f"{size}: every node runs an equal share of the ranks")
    if headless and nnodes == 1:
        raise SettingError("headless", "needs --nnodes > 1: a headless node runs its share "
                           "of a group spread over several nodes")
    if headless and node == 0:
        raise SettingError("headless", "needs --node-rank > 0: node 0 holds rank 0, which "
                           "the scheduler talks to (run it without --headless)")
    if node > 0 and not headless:
        raise SettingError("node_rank", f"{node} runs tensor-parallel ranks only: start it "
                           "with `folio serve --headless` (or `folio executor --headless`; "
                           "node 0 runs the scheduler)")
    if nnodes == 1:
        return
    if not engine.master_addr:
        raise SettingError("master_addr", "is required with --nnodes > 1: node 0's address "
                           "the other nodes reach")
    if not transport.curve_keys and not transport.insecure_transport:
        raise SettingError("curve_keys", "is required with --nnodes > 1: rank 0's plans "
                           "travel to the other nodes over TCP (or --insecure-transport on "
                           "a trusted network)")


def check_keys(args: argparse.Namespace) -> KeysSettings:
    return config_of(KeysSettings, args)


def check_probe(args: argparse.Namespace) -> ProbePlan:
    return ProbePlan(config_of(ProbeSettings, args), config_of(TransportSettings, args).curve_keys)


def check_simulate(args: argparse.Namespace):
    from folio.planner.simulator.command import SimulateSettings

    return config_of(SimulateSettings, args)


def check_plan(args: argparse.Namespace):
    from folio.planner.command import PlanSettings

    return config_of(PlanSettings, args)


CHECKS = {"serve": check_serve, "frontend": check_frontend, "scheduler": check_scheduler,
          "executor": check_executor, "keys": check_keys, "probe": check_probe,
          "simulate": check_simulate, "plan": check_plan}


def api_key(http: HttpSettings) -> str | None:
    """--api-key (or FOLIO_API_KEY), or the first line of --api-key-file."""
    if not http.api_key_file:
        return http.api_key
    if http.api_key:
        raise SettingError("api_key_file", "and --api-key (FOLIO_API_KEY) are both given: "
                           "give one of them")
    try:
        lines = Path(http.api_key_file).read_text(encoding="utf-8").strip().splitlines()
    except (OSError, UnicodeDecodeError) as error:
        raise SettingError("api_key_file", f"{http.api_key_file}: cannot read it ({error})") \
            from None
    if not lines or not lines[0].strip():
        raise SettingError("api_key_file", f"{http.api_key_file} is empty")
    return lines[0].strip()


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
