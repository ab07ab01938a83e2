"""Nonsense settings are refused up front: one line naming the setting, exit status 2, no
process started (`folio serve`, each role), a ValueError from `LLM(...)`; the scheduler
survives an executor hello that makes an invalid config; every flag, FOLIO_* variable and
--help line is generated from the declared settings, and `folio serve` hands its settings
to its processes unchanged."""

from __future__ import annotations

import dataclasses
import json
import logging
import os
import re
import subprocess
import sys
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
import zmq

from folio.cli import build_parser
from folio.flags import config_flags, config_values
from folio.default_model import default_model_path
from folio.scheduler.service import SchedulerService, SchedulerServiceConfig
from folio.shared.protocol import messages as m
from folio.shared.config import ExecutorCapacity

ROOT = Path(__file__).resolve().parents[2]
MODEL = default_model_path()


def _model_copy(tmp_path: Path, name: str, config_change=None, weights: bytes | None = None
                ) -> Path:
    """The built-in model's files in a directory of their own, one of them spoiled."""
    target = tmp_path / name
    target.mkdir()
    for file in MODEL.iterdir():
        if file.suffix == ".json" or file.name.endswith(".jinja"):
            (target / file.name).write_bytes(file.read_bytes())
    if config_change is not None:
        raw = json.loads((target / "config.json").read_text())
        config_change(raw)
        (target / "config.json").write_text(json.dumps(raw))
    if weights is None:
        (target / "model.safetensors").symlink_to(MODEL / "model.safetensors")
    else:
        (target / "model.safetensors").write_bytes(weights)
    return target


def _no_config(tmp_path: Path) -> Path:
    target = _model_copy(tmp_path, "no-config")
    (target / "config.json").unlink()
    return target


def _truncated(tmp_path: Path) -> Path:
    return _model_copy(tmp_path, "truncated",
                       weights=(MODEL / "model.safetensors").read_bytes()[:4096])


def _garbage(tmp_path: Path) -> Path:
    return _model_copy(tmp_path, "garbage", weights=b"not a safetensors file at all")


def _gpt2(tmp_path: Path) -> Path:
    return _model_copy(tmp_path, "gpt2",
                       lambda raw: raw.update(architectures=["GPT2LMHeadModel"]))


def _bad_json(tmp_path: Path) -> Path:
    target = _model_copy(tmp_path, "bad-json")
    (target / "config.json").write_text("{not json")
    return target


# (flags, or a maker of a bad model directory; the flag the error must name; a word of it)
CASES = {
    "negative-block-size": (["--block-size", "-3"], "--block-size", "positive"),
    "odd-block-size": (["--block-size", "3"], "--block-size", "power of two"),
    "zero-kv-blocks": (["--num-kv-blocks", "0"], "--num-kv-blocks", "positive"),
    "no-config-json": (_no_config, "--model", "config.json"),
    "config-not-json": (_bad_json, "--model", "JSON"),
    "truncated-safetensors": (_truncated, "--model", "safetensors"),
    "garbage-safetensors": (_garbage, "--model", "safetensors"),
    "unsupported-architecture": (_gpt2, "--model", "GPT2LMHeadModel"),
    "no-chunked-prefill-small-budget": (
        ["--no-enable-chunked-prefill", "--max-num-batched-tokens", "64"],
        "--max-num-batched-tokens", "chunked prefill"),
    "impossible-max-model-len": (["--max-model-len", "1000000"], "--max-model-len",
                                 "larger than the model supports"),
    "zero-max-num-seqs": (["--max-num-seqs", "0"], "--max-num-seqs", "positive"),
    "zero-executor-timeout": (["--executor-timeout", "0"], "--executor-timeout", "> 0"),
    "kv-cache-beyond-memory": (["--device", "cpu", "--cpu-kv-cache-gib", "1000000"],
                               "--cpu-kv-cache-gib", "does not fit"),
    "port-out-of-range": (["--port", "70000"], "--port", "65535"),
    "wildcard-address": (["--zmq-address", "tcp://*:5555"], "--zmq-address", "bind"),
    "hidden-wildcard-address": (["--zmq-address", "tcp://0x0:5555"], "--zmq-address", "bind"),
    "missing-lora-adapter": (["--enable-lora", "--lora-modules", "sql=/nonexistent/adapter"],
                             "--lora-modules", "adapter_config.json is missing"),
}


def _flags(case, tmp_path: Path) -> list[str]:
    flags = case[0]
    return ["--model", str(flags(tmp_path))] if callable(flags) else list(flags)


def _processes_tagged(tag: str) -> list[int]:
    """Processes whose environment carries `tag`: children of a `folio serve` we ran."""
    found = []
    for proc in Path("/proc").iterdir():
        try:
            if proc.name.isdigit() and tag.encode() in (proc / "environ").read_bytes():
                found.append(int(proc.name))
        except OSError:
            pass
    return found


def _run_folio(args: list[str], tag: str, cwd: Path) -> subprocess.CompletedProcess:
    env = {key: value for key, value in os.environ.items() if not key.startswith("FOLIO_")}
    env["FOLIO_SETTINGS_TEST"] = tag   # FOLIO_* is Folio's settings: none but the tag
    return subprocess.run([sys.executable, "-m", "folio", *args], capture_output=True,
                          text=True, timeout=120, env=env, cwd=cwd)


def _refused(args: list[str], cwd: Path) -> tuple[subprocess.CompletedProcess, list[int]]:
    """`folio ARGS` run to its end; then the processes it left behind (none, when it
    refused the setting before starting any), looked for as soon as it has exited."""
    tag = uuid.uuid4().hex
    result = _run_folio(args, tag, cwd)
    return result, _processes_tagged(tag)


def _side_by_side(runs: dict) -> dict:
    """{key: (args, cwd)} run at once, each a real process of its own: they only parse,
    check and exit, so the suite need not wait for their starts one after another."""
    with ThreadPoolExecutor(len(runs)) as pool:
        futures = {key: pool.submit(_refused, *run) for key, run in runs.items()}
        return {key: future.result() for key, future in futures.items()}


@pytest.fixture(scope="module")
def serve_refusals(tmp_path_factory) -> dict:
    """Each case of CASES through `folio serve`: (its result, the processes it left)."""
    runs = {}
    for name, case in CASES.items():
        cwd = tmp_path_factory.mktemp(name)
        runs[name] = (["serve", "--port", "0", *_flags(case, cwd)], cwd)
    return _side_by_side(runs)


@pytest.mark.parametrize("name", CASES)
def test_serve_refuses_a_nonsense_setting_in_one_line(name, serve_refusals):
    case = CASES[name]
    result, left_behind = serve_refusals[name]
    lines = result.stderr.strip().splitlines()
    assert result.returncode == 2, result.stderr
    assert len(lines) == 1 and "Traceback" not in result.stderr, result.stderr
    assert case[1] in lines[0] and case[2] in lines[0], lines[0]
    assert lines[0].startswith("folio serve: error:")
    assert left_behind == []


ROLE_CASES = [
    ("executor", ["--scheduler-address", "ipc:///nonexistent/x.sock", "--block-size", "-3"],
     "--block-size"),
    ("executor", ["--scheduler-address", "ipc:///nonexistent/x.sock", "--max-model-len",
                  "1000000"], "--max-model-len"),
    ("scheduler", ["--frontend-address", "ipc:///nonexistent/f.sock", "--executor-address",
                   "ipc:///nonexistent/e.sock", "--max-n", "0"], "--max-n"),
    ("scheduler", ["--frontend-address", "ipc:///nonexistent/f.sock", "--executor-address",
                   "ipc:///nonexistent/e.sock", "--step-timeout", "-1"], "--step-timeout"),
    ("frontend", ["--client-address", "ipc:///nonexistent/c.sock", "--scheduler-address",
                  "ipc:///nonexistent/f.sock", "--model", "/nonexistent"], "--model"),
    ("frontend", ["--client-address", "udp://x", "--scheduler-address",
                  "ipc:///nonexistent/f.sock"], "--client-address"),
    ("scheduler", ["--frontend-address", "tcp://0.0.0.0:1", "--executor-address",
                   "ipc:///nonexistent/e.sock"], "--frontend-address"),
]


@pytest.fixture(scope="module")
def role_refusals(tmp_path_factory) -> dict:
    """Each of ROLE_CASES through its role's command: (its result, the processes it left)."""
    cwd = tmp_path_factory.mktemp("roles")
    return _side_by_side({(role, *args): ([role, *args], cwd) for role, args, _ in ROLE_CASES})


@pytest.mark.parametrize("role, args, flag", ROLE_CASES)
def test_each_role_refuses_a_nonsense_setting_in_one_line(role, args, flag, role_refusals):
    result, _ = role_refusals[(role, *args)]
    lines = result.stderr.strip().splitlines()
    assert result.returncode == 2, result.stderr
    assert len(lines) == 1 and lines[0].startswith(f"folio {role}: error: {flag}"), lines


def test_executor_model_problems_are_refused_before_loading(tmp_path):
    result = _run_folio(["executor", "--scheduler-address", "ipc:///nonexistent/x.sock",
                         "--model", str(_truncated(tmp_path))], uuid.uuid4().hex, tmp_path)
    lines = result.stderr.strip().splitlines()
    assert result.returncode == 2 and len(lines) == 1, result.stderr
    assert lines[0].startswith("folio executor: error: --model") and "safetensors" in lines[0]


LLM_CASES = {   # the same nonsense as keyword arguments (server-only settings left out)
    "negative-block-size": dict(block_size=-3),
    "zero-kv-blocks": dict(num_kv_blocks=0),
    "no-chunked-prefill-small-budget": dict(enable_chunked_prefill=False,
                                            max_num_batched_tokens=64),
    "impossible-max-model-len": dict(max_model_len=1_000_000),
    "zero-max-num-seqs": dict(max_num_seqs=0),
    "kv-cache-beyond-memory": dict(device="cpu", cpu_kv_cache_gib=1_000_000),
}
MODEL_CASES = ("no-config-json", "config-not-json", "truncated-safetensors",
               "garbage-safetensors", "unsupported-architecture")


@pytest.mark.parametrize("name", [*LLM_CASES, *MODEL_CASES])
def test_llm_refuses_the_same_settings_with_a_value_error(name, tmp_path):
    from folio import LLM

    _, flag, words = CASES[name]
    kwargs = dict(LLM_CASES.get(name, {}))
    if name in MODEL_CASES:
        kwargs["model"] = str(CASES[name][0](tmp_path))
    with pytest.raises(ValueError) as error:
        LLM(**kwargs)
    message = str(error.value)
    assert message.startswith(flag.removeprefix("--").replace("-", "_")) and words in message


def test_llm_without_a_model_serves_the_built_in_one():
    from folio import LLM, SamplingParams

    llm = LLM(num_kv_blocks=64)
    assert Path(llm.config.model) == MODEL
    out = llm.generate("The for statement", SamplingParams(max_tokens=3, temperature=0))
    assert len(out[0].outputs[0].token_ids) == 3


# ---- the scheduler at an executor's hello ----------------------------------------------

def _capacity(max_model_len: int) -> ExecutorCapacity:
    return ExecutorCapacity(num_kv_blocks=32, block_size=16, max_model_len=max_model_len,
                            vocab_size=1024, eos_token_ids=(0,))


def _hello(svc: SchedulerService, dealer: zmq.Socket, capacity: ExecutorCapacity,
           pid: int) -> None:
    """Send a hello over the real socket and let the service read it."""
    dealer.send(m.encode_hello_executor(capacity, pid))
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline and not svc.executor_sock.poll(50):
        pass
    svc._read_burst(svc.executor_sock, svc._on_executor_message)


def test_scheduler_refuses_an_executor_whose_capacity_makes_an_invalid_config(tmp_path,
                                                                              caplog):
    svc = SchedulerService(SchedulerServiceConfig(
        frontend_address=f"ipc://{tmp_path}/fe.sock",
        executor_address=f"ipc://{tmp_path}/ex.sock",
        enable_chunked_prefill=False, max_num_batched_tokens=64))
    ctx = zmq.Context()
    dealer = ctx.socket(zmq.DEALER)
    dealer.setsockopt(zmq.LINGER, 0)
    dealer.setsockopt(zmq.IDENTITY, b"executor-a")
    dealer.connect(svc.config.executor_address)
    try:
        with caplog.at_level(logging.ERROR, logger="folio.scheduler"):
            _hello(svc, dealer, _capacity(256), 101)   # 256 > 64 without chunked prefill
        assert svc.scheduler is None and svc.executor_link.identity is None
        refusals = [r for r in caplog.records if "refused executor 101" in r.getMessage()]
        assert len(refusals) == 1 and "max_num_batched_tokens" in refusals[0].getMessage()
        _hello(svc, dealer, _capacity(64), 102)         # one that fits is attached
        assert svc.scheduler is not None and svc.executor_link.pid == 102
        _hello(svc, dealer, _capacity(512), 102)        # the attached one resets: detached
        assert svc.scheduler is None and svc.executor_link.identity is None
    finally:
        dealer.close()
        ctx.term()
        svc.close()


# ---- one config chain, flags, help, README ---------------------------------------------

def test_scheduler_flags_round_trip_through_its_config():
    config = SchedulerServiceConfig(
        frontend_address="ipc:///run/f.sock", executor_address="ipc:///run/e.sock",
        max_num_seqs=7, enable_chunked_prefill=False, max_num_batched_tokens=4096,
        preemption_mode="swap", max_logprobs=3, max_n=5, max_queued_requests=9,
        executor_timeout_s=4.5, step_timeout_s=30.0, shutdown_timeout_s=2.0,
        curve_keys="/keys", async_scheduling=False)
    args = build_parser().parse_args(["scheduler", *config_flags(config)])
    assert SchedulerServiceConfig(**config_values(args, SchedulerServiceConfig)) == config
    assert "--executor-timeout" in config_flags(config)   # the flag names stay


def test_serve_passes_its_scheduler_settings_to_the_scheduler(tmp_path, monkeypatch):
    from folio.checks import check_serve
    from folio.serve import Supervisor

    monkeypatch.setenv("TMPDIR", str(tmp_path))
    args = build_parser().parse_args([
        "serve", "--max-num-seqs", "5", "--no-async-scheduling", "--step-timeout", "9",
        "--max-queued-tokens", "100", "--shutdown-timeout", "3", "--max-n", "2"])
    supervisor = Supervisor(check_serve(args))
    try:
        command = supervisor.command("scheduler")
        parsed = build_parser().parse_args(command[command.index("scheduler"):])
        config = SchedulerServiceConfig(**config_values(parsed, SchedulerServiceConfig))
        assert config == supervisor.scheduler_config
        assert (config.max_num_seqs, config.async_scheduling, config.step_timeout_s,
                config.max_queued_tokens, config.shutdown_timeout_s, config.max_n) == \
            (5, False, 9.0, 100, 3.0, 2)
    finally:
        supervisor.stop_all()


def test_serve_passes_its_frontend_settings_to_the_frontend(tmp_path, monkeypatch):
    from folio.checks import check_frontend, check_serve
    from folio.serve import Supervisor

    monkeypatch.setenv("TMPDIR", str(tmp_path))
    monkeypatch.setenv("FOLIO_API_KEY", "secret")
    args = build_parser().parse_args([
        "serve", "--port", "0", "--host", "127.0.0.2", "--served-model-name", "a", "b",
        "--metrics-public", "--tool-call-parser", "hermes", "--allowed-hosts", "x,y",
        "--shutdown-timeout", "4", "--max-requests-per-client", "7"])
    supervisor = Supervisor(check_serve(args))
    try:
        supervisor.plan = dataclasses.replace(supervisor.plan, http=dataclasses.replace(
            supervisor.plan.http, port=8123))   # as if 8123 were free: HTTP flags go too
        command = supervisor.command("frontend")
        assert "secret" not in command   # the key travels in the environment only
        monkeypatch.setenv("FOLIO_API_KEY", supervisor.child_env("frontend")["FOLIO_API_KEY"])
        config = check_frontend(build_parser().parse_args(command[command.index("frontend"):]))
        assert (config.host, config.port, config.served_model_name, config.api_key,
                config.metrics_public, config.tool_call_parser, config.allowed_hosts,
                config.shutdown_timeout_s, config.max_requests_per_client) == \
            ("127.0.0.2", 8123, ["a", "b"], "secret", True, "hermes", "x,y", 4.0, 7)
        assert config.scheduler_address == supervisor.frontend_address
    finally:
        supervisor.stop_all()


def test_every_declared_setting_is_a_flag_with_its_default_and_variable():
    from folio.flags import env_name, flag_name
    from folio.command_settings import COMMANDS

    parser = build_parser()
    sub = next(a for a in parser._actions if isinstance(a.choices, dict))
    for command in COMMANDS:
        role_parser = sub.choices[command.name]
        actions = {a.dest: a for a in role_parser._actions}
        for group in command.groups:
            for spec in dataclasses.fields(group.config):
                if spec.name in group.skip:
                    continue
                action = actions[spec.name]
                if not spec.metadata.get("positional"):
                    assert action.option_strings[0] == "--" + flag_name(spec)
                default = group.defaults.get(spec.name, spec.default)
                if spec.metadata.get("repeat"):
                    default = []
                if default is dataclasses.MISSING:
                    assert action.required or not action.option_strings, spec.name
                else:
                    assert action.default == default, (command.name, spec.name)
                assert role_parser.env_names.get(spec.name) == env_name(spec)
    assert sub.choices["keys"].env_names["curve_keys"] == "FOLIO_CURVE_KEYS"   # --dir


def test_a_bad_folio_variable_is_refused_in_one_line(tmp_path):
    env = {key: value for key, value in os.environ.items() if not key.startswith("FOLIO_")}
    result = subprocess.run([sys.executable, "-m", "folio", "serve"], capture_output=True,
                            text=True, timeout=120, env={**env, "FOLIO_PORT": "eighty"},
                            cwd=tmp_path)
    lines = result.stderr.strip().splitlines()
    assert result.returncode == 2 and len(lines) == 1, result.stderr
    assert "environment variable FOLIO_PORT='eighty'" in lines[0]


@pytest.mark.parametrize("flags, words", [
    (["--api-key", "k", "--api-key-file", "{file}"], "both given"),
    (["--api-key-file", "{empty}"], "is empty"),
    (["--api-key-file", "{missing}"], "cannot read"),
])
def test_api_key_file_problems_are_one_line_errors(flags, words, tmp_path, capsys):
    from folio.cli import main

    (tmp_path / "key").write_text("k2\n")
    (tmp_path / "empty").write_text("\n")
    paths = {"file": tmp_path / "key", "empty": tmp_path / "empty",
             "missing": tmp_path / "missing"}
    assert main(["serve", "--port", "0", *[f.format(**paths) for f in flags]]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and err.startswith("folio serve: error: --api-key-file")
    assert words in err


def test_serve_and_the_cli_do_not_import_each_other():
    out = subprocess.run([sys.executable, "-c", "import sys, folio.serve; "
                          "print('folio.cli' in sys.modules)"], capture_output=True,
                         text=True, timeout=120)
    assert out.stdout.strip() == "False", out.stderr


def test_log_level_before_or_after_the_subcommand(monkeypatch):
    parse = build_parser().parse_args
    assert parse(["serve", "--log-level", "debug"]).log_level == "DEBUG"
    assert parse(["--log-level", "warning", "serve"]).log_level == "WARNING"
    monkeypatch.setenv("FOLIO_LOG_LEVEL", "error")
    assert parse(["serve"]).log_level == "ERROR"
    assert parse(["--log-level", "debug", "serve"]).log_level == "DEBUG"   # flag wins


def test_every_help_line_has_a_sentence_and_its_default():
    parser = build_parser()
    sub = next(a for a in parser._actions if isinstance(a.choices, dict))
    silent = []
    for role in ("serve", "frontend", "scheduler", "executor", "keys", "probe"):
        role_parser = sub.choices[role]
        formatter = role_parser._get_formatter()
        for action in role_parser._actions:
            if not action.option_strings or action.dest == "help":
                continue
            text = formatter._expand_help(action) if action.help else ""
            if len(text.split()) < 3:
                silent.append(f"{role} {action.option_strings[0]}: no sentence")
            elif "default" not in text and "(required)" not in text:
                silent.append(f"{role} {action.option_strings[0]}: no default in {text!r}")
    assert silent == []
    help_text = sub.choices["serve"].format_help()
    words = " ".join(help_text.split())
    assert "tokens per KV block (a power of two) (default: 16)" in words
    assert "reuse KV blocks of identical prompt prefixes (default: on)" in words
    assert "--num-swap-blocks NUM_SWAP_BLOCKS CPU swap blocks (default: from swap-space)" in words


def test_readme_sdk_examples_connect_to_what_the_first_command_serves():
    readme = (ROOT / "README.md").read_text()
    first = re.search(r"```bash\n(.*?)\n", readme).group(1)
    served = re.search(r"folio serve .*--zmq-address (\S+)", first)
    assert served, f"the first command names no --zmq-address: {first}"
    # The README's SDK examples and docs/sdk.md's, which they point to, say the same address.
    for page in (readme, (ROOT / "docs/sdk.md").read_text()):
        section = page.split("## Client SDK", 1)[1].split("\n## ", 1)[0]
        addresses = re.findall(r"Client\(\"([^\"]+)\"", section)
        assert addresses and set(addresses) == {served.group(1)}
    assert "LLM()" in readme   # the offline API without a model: the built-in one
