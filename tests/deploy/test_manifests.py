"""deploy/*.yaml, Folio's Kubernetes manifests, checked without a cluster: they are
deploy/render.py's current output, they validate against the Kubernetes API schemas
(offline, a pinned version), each container's command is one `folio` accepts, the CURVE key
files each container sees are what its role loads, and render.py's options change what
they should.
"""

from __future__ import annotations  # noqa: I001 (ruff sorts folio.shared as third-party)

import copy
import os
import shutil
import socket
from pathlib import Path

import pytest
import yaml

from deploy import render
from folio.cli import build_parser
from folio.shared.security import EXECUTOR, FRONTEND, generate_keys, load_keys
from tests.deploy.manifest_checks import lint, pod_templates, schema_errors

ROOT = Path(__file__).resolve().parents[2]
# The multi-node flags, whose $(LWS_*) values LeaderWorkerSet fills in at run time.
FUTURE_FLAGS = {"--nnodes": 1, "--node-rank": 1, "--master-addr": 1, "--headless": 0}


def _documents(name: str) -> list[dict]:
    return list(yaml.safe_load_all((ROOT / "deploy" / name).read_text()))


def _containers(documents: list[dict]) -> list[tuple[str, dict, dict]]:
    """(where, pod spec, container) of every container."""
    return [(where, t["spec"], c) for d in documents for where, t in pod_templates(d)
            for c in t["spec"]["containers"]]


def _by_name(documents: list[dict], name: str) -> list[dict]:
    return [c for _, _, c in _containers(documents) if c["name"] == name]


def _env(container: dict) -> dict[str, str]:
    return {e["name"]: e.get("value") for e in container.get("env", [])}


@pytest.fixture(scope="module", params=sorted(render.DEFAULTS))
def committed(request) -> tuple[str, list[dict]]:
    return request.param, _documents(request.param)


def test_committed_manifests_are_current():
    """deploy/*.yaml is render.py's output for DEFAULTS: an edit of either alone fails."""
    on_disk = {p.name for p in (ROOT / "deploy").glob("*.yaml")}
    assert on_disk == set(render.DEFAULTS)
    for name, options in render.DEFAULTS.items():
        assert (ROOT / "deploy" / name).read_text() == render.to_yaml(options), \
            f"deploy/{name} is stale: run python deploy/render.py --write-defaults"


def test_manifests_validate_against_the_kubernetes_schemas(committed, monkeypatch):
    # The schemas come with the package: validating needs no network.
    def no_network(*args, **kwargs):
        raise AssertionError("validation tried to reach the network")

    monkeypatch.setattr(socket.socket, "connect", no_network)
    name, documents = committed
    errors = [e for d in documents for e in schema_errors(d)]
    assert errors == [], name
    assert lint(documents) == [], name


def test_broken_manifests_fail_validation():
    documents = _documents("folio-gpu.yaml")
    deployment = documents[0]
    # The schema: a misspelt field, a wrong type.
    broken = copy.deepcopy(deployment)
    broken["spec"]["template"]["spec"]["containers"][2]["readinesProbe"] = {}
    assert any("readinesProbe" in e for e in schema_errors(broken))
    broken = copy.deepcopy(deployment)
    broken["spec"]["replicas"] = "one"
    assert schema_errors(broken)
    # What the schema cannot see: a probe's port name no container declares, no image,
    # a Service selecting nothing.
    broken = copy.deepcopy(documents)
    frontend = broken[0]["spec"]["template"]["spec"]["containers"][2]
    frontend["readinessProbe"]["httpGet"]["port"] = "helth"
    assert lint(broken) == [
        "Deployment/folio/frontend: readinessProbe names port 'helth', not declared"]
    broken = copy.deepcopy(documents)
    del broken[0]["spec"]["template"]["spec"]["containers"][1]["image"]
    assert lint(broken) == ["Deployment/folio/executor: no image"]
    broken = copy.deepcopy(documents)
    broken[1]["spec"]["selector"]["app.kubernetes.io/component"] = "frontend"
    assert lint(broken) == ["Service/folio: its selector matches no pod"]
    # The LeaderWorkerSet: its own fields and its pod templates.
    lws = copy.deepcopy(_documents("folio-multinode-gpu.yaml")[-1])
    lws["spec"]["leaderWorkerTemplate"]["sise"] = 2
    lws["spec"]["leaderWorkerTemplate"]["workerTemplate"]["spec"]["containers"][0][
        "args"] = "executor"
    errors = schema_errors(lws)
    assert any("sise" in e for e in errors) and any("workerTemplate" in e or
                                                   "args" in e for e in errors), errors
    assert len(errors) == 2


def _strip_future(args: list[str]) -> list[str]:
    kept, skip = [], 0
    for arg in args:
        if skip:
            skip -= 1
        elif arg in FUTURE_FLAGS:
            skip = FUTURE_FLAGS[arg]
        else:
            kept.append(arg)
    return kept


def test_commands_and_settings_are_folio_s(committed):
    """Every container runs a `folio` role with flags it has, every probe is a `folio
    probe` that parses, every FOLIO_* variable is one its role reads, and a wildcard bind
    comes with FOLIO_ALLOW_WILDCARD."""
    from folio.command_settings import ENVIRONMENT_ONLY

    name, documents = committed
    parser = build_parser()
    roles = next(a for a in parser._actions if isinstance(a.choices, dict)).choices
    for where, _, container in _containers(documents):
        args = container["args"]
        role = args[0]
        assert role == container["name"] and container["image"].startswith("folio:")
        if "--headless" in args:   # a worker rank: no scheduler link, so no full parse yet
            known = {s for a in roles[role]._actions for s in a.option_strings}
            assert {a for a in _strip_future(args) if a.startswith("--")} <= known
        else:
            parser.parse_args(_strip_future(args))
        # Only the multi-node executors use the flags to come.
        assert (_strip_future(args) != args) == (name.startswith("folio-multinode")
                                                 and role == "executor"), where
        for kind in ("startupProbe", "readinessProbe", "livenessProbe"):
            command = container.get(kind, {}).get("exec", {}).get("command")
            if command:
                assert command[:2] == ["folio", "probe"]
                parser.parse_args(command[1:])
        env = _env(container)
        known = {*roles[role].env_names.values(), *parser.env_names.values(),
                 *ENVIRONMENT_ONLY}
        assert {v for v in env if v.startswith("FOLIO_")} <= known, where
        assert ("FOLIO_ALLOW_WILDCARD" in env) == any("0.0.0.0" in a for a in args), where


def _lay_out(volume: dict, keys: Path, into: Path) -> Path:
    """The directory a Secret volume with `items` shows its container."""
    for item in volume["secret"]["items"]:
        target = into / item["path"]
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(keys / item["key"], target)
    return into


def _loads(role: str, directory: Path) -> None:
    """What the role's process and its `folio probe` load from /keys."""
    if role == "scheduler":
        load_keys(directory, server=True, client=False, serves=(FRONTEND, EXECUTOR))
    elif role == "executor":
        load_keys(directory, peer=EXECUTOR)
    else:
        load_keys(directory, server=True, client=True, peer=FRONTEND)
        load_keys(directory, server=False, client=True, peer=FRONTEND)   # FOLIO_CLIENT_CURVE=0
    if role != "frontend":
        load_keys(directory, peer=FRONTEND)   # its `folio probe`


def test_each_container_sees_the_keys_its_role_loads(committed, tmp_path):
    """The Secret holds the top-level files of `folio keys --dir`; each container's
    projection of it is enough for its role and its probe, and holds no other secret."""
    name, documents = committed
    keys = tmp_path / "keys"
    generate_keys(keys)
    top_level = {p.name for p in keys.iterdir() if p.is_file()}
    checked = set()
    for where, pod, container in _containers(documents):
        mounts = [m for m in container.get("volumeMounts", []) if m["mountPath"] == "/keys"]
        if not mounts:
            assert "--headless" in container["args"], where   # only workers go without
            continue
        assert mounts[0]["readOnly"] is True
        volume = next(v for v in pod["volumes"] if v["name"] == mounts[0]["name"])
        assert volume["secret"]["secretName"] == render.KEYS_SECRET
        assert {i["key"] for i in volume["secret"]["items"]} <= top_level
        role = container["name"]
        _loads(role, _lay_out(volume, keys, tmp_path / f"{name}-{role}"))
        secrets = {i["key"] for i in volume["secret"]["items"] if i["key"].endswith("_secret")}
        assert secrets == {"scheduler": {"server.key_secret", "frontend.key_secret"},
                           "executor": {"executor.key_secret", "frontend.key_secret"},
                           "frontend": {"server.key_secret", "frontend.key_secret"}}[role]
        checked.add(role)
    assert checked == {"scheduler", "executor", "frontend"}


def test_a_missing_key_file_is_caught(tmp_path):
    keys = tmp_path / "keys"
    generate_keys(keys)
    volume = render.keys_volume("scheduler", ("client",))
    volume["secret"]["items"] = [i for i in volume["secret"]["items"]
                                 if i["key"] != "server.key"]
    with pytest.raises(FileNotFoundError, match="server.key"):
        _loads("scheduler", _lay_out(volume, keys, tmp_path / "scheduler"))


def test_model_is_mounted_read_only(committed):
    _, documents = committed
    for where, pod, container in _containers(documents):
        model = [m for m in container.get("volumeMounts", []) if m["name"] == "model"]
        if container["name"] == "scheduler":
            assert model == []
            continue
        assert model == [{"name": "model", "mountPath": "/models", "readOnly": True}], where
        volume = next(v for v in pod["volumes"] if v["name"] == "model")
        assert volume["persistentVolumeClaim"] == {"claimName": "folio-models",
                                                   "readOnly": True}


def test_replicas_option():
    documents = render.render(render.Options(replicas=3))
    statefulset = next(d for d in documents if d["kind"] == "StatefulSet")
    assert statefulset["spec"]["replicas"] == 3
    (frontend,) = _by_name(documents, "frontend")
    addresses = frontend["args"][frontend["args"].index("--scheduler-address") + 1]
    assert addresses.split(",") == [f"tcp://folio-replica-{i}.folio-replica:5556"
                                    for i in range(3)]
    assert statefulset["spec"]["serviceName"] == "folio-replica"
    # Each replica's scheduler is reached by the frontend; its executor link stays inside.
    (scheduler,) = _by_name(documents, "scheduler")
    assert scheduler["args"][1:] == ["--frontend-address", "tcp://0.0.0.0:5556",
                                     "--executor-address", "tcp://127.0.0.1:5557"]
    assert lint(documents) == [] and [e for d in documents for e in schema_errors(d)] == []
    # One replica: everything in one pod, every link on its loopback.
    single = render.render(render.Options())
    assert [d["kind"] for d in single] == ["Deployment", "Service"]
    assert not any("0.0.0.0" in a for a in _by_name(single, "scheduler")[0]["args"])


def _gpus(container: dict) -> tuple[str | None, str | None]:
    resources = container["resources"]
    return (resources["requests"].get("nvidia.com/gpu"),
            resources.get("limits", {}).get("nvidia.com/gpu"))


@pytest.mark.parametrize("options, per_pod", [
    (render.Options(), "1"),
    (render.Options(tensor_parallel_size=4), "4"),
    (render.Options(replicas=2, tensor_parallel_size=2), "2"),
    (render.Options(nodes=2, tensor_parallel_size=16), "8"),
])
def test_gpu_requests_follow_tensor_parallel_size(options, per_pod):
    documents = render.render(options)
    for where, pod, container in _containers(documents):
        if container["name"] == "executor":
            assert _gpus(container) == (per_pod, per_pod), where
            assert pod["tolerations"][0]["key"] == "nvidia.com/gpu"
            assert str(options.tensor_parallel_size) in container["args"]
        else:
            assert _gpus(container) == (None, None), where
    assert lint(documents) == []


def test_cpu_option_requests_no_gpu():
    documents = render.render(render.Options(device="cpu", tensor_parallel_size=2))
    for where, pod, container in _containers(documents):
        assert _gpus(container) == (None, None), where
        assert container["image"] == "folio:cpu" and "tolerations" not in pod
    (executor,) = _by_name(documents, "executor")
    assert _env(executor)["FOLIO_DEVICE"] == "cpu"


def test_multinode_option():
    documents = render.render(render.Options(nodes=4, tensor_parallel_size=8, replicas=2))
    lws = documents[-1]
    assert lws["kind"] == "LeaderWorkerSet" and lws["spec"]["replicas"] == 2
    assert lws["spec"]["leaderWorkerTemplate"]["size"] == 4
    templates = lws["spec"]["leaderWorkerTemplate"]
    leader = {c["name"]: c for c in templates["leaderTemplate"]["spec"]["containers"]}
    (worker,) = templates["workerTemplate"]["spec"]["containers"]
    assert set(leader) == {"scheduler", "executor"}
    lws_flags = ["--nnodes", "$(LWS_GROUP_SIZE)", "--node-rank", "$(LWS_WORKER_INDEX)",
                 "--master-addr", "$(LWS_LEADER_ADDRESS)"]
    assert leader["executor"]["args"][-6:] == lws_flags
    assert worker["args"][-7:] == [*lws_flags, "--headless"]
    assert "--scheduler-address" not in worker["args"]
    (frontend,) = _by_name(documents, "frontend")
    assert "tcp://folio-tp-0.folio-tp:5556,tcp://folio-tp-1.folio-tp:5556" in frontend["args"]
    # A $(VAR) outside a LeaderWorkerSet is not defined by anyone.
    broken = copy.deepcopy(documents)
    broken[0]["spec"]["template"]["spec"]["containers"][0]["args"].append("$(LWS_GROUP_SIZE)")
    assert lint(broken) == [
        "Deployment/folio-frontend/frontend: $(LWS_GROUP_SIZE) is not defined"]


def test_model_and_client_options():
    documents = render.render(render.Options(model_host_path="/srv/models/qwen",
                                             model_path="/models/snapshot",
                                             clients=("client", "alice")))
    (deployment, _) = documents
    volumes = {v["name"]: v for v in deployment["spec"]["template"]["spec"]["volumes"]}
    assert volumes["model"] == {"name": "model", "hostPath": {
        "path": "/srv/models/qwen", "type": "Directory"}}
    assert {"key": "alice.key", "path": "authorized_clients/alice.key"} in \
        volumes["keys-frontend"]["secret"]["items"]
    for container in (*_by_name(documents, "executor"), *_by_name(documents, "frontend")):
        assert container["args"][container["args"].index("--model") + 1] == "/models/snapshot"


@pytest.mark.parametrize("argv, message", [
    (["--nodes", "2", "--tensor-parallel-size", "3"],
     "--tensor-parallel-size must be a multiple of --nodes"),
    (["--replicas", "0"], "--replicas must be at least 1"),
    (["--device", "cpu", "--nodes", "2", "--tensor-parallel-size", "2"], "--nodes above 1"),
    (["--model-path", "/data/x"], "--model-path must be under /models"),
])
def test_bad_options_are_refused_in_one_line(argv, message, capsys):
    with pytest.raises(SystemExit) as stop:
        render.main(argv)
    assert stop.value.code == 2
    assert message in capsys.readouterr().err


def test_render_writes_what_it_is_asked(tmp_path):
    out = tmp_path / "folio.yaml"
    assert render.main(["--replicas", "2", "-o", str(out)]) == 0
    assert out.read_text() == (ROOT / "deploy/folio-replicas-gpu.yaml").read_text()


def _check_role(container: dict, monkeypatch, keys: Path) -> None:
    """Folio's own checks of the container's command, with its environment: the demo
    model stands in for /models, and one rank for the demo model's few heads."""
    from folio.checks import CHECKS
    from folio.default_model import __file__ as default_model

    model = str(Path(default_model).parent / "weights")
    args = [model if a.startswith("/models") else a for a in _strip_future(container["args"])]
    if "--tensor-parallel-size" in args:
        args[args.index("--tensor-parallel-size") + 1] = "1"
    with monkeypatch.context() as env:
        for name in [n for n in os.environ if n.startswith("FOLIO_")]:
            env.delenv(name)
        for variable in container.get("env", []):
            if "value" in variable:
                env.setenv(variable["name"], variable["value"])
        env.setenv("FOLIO_CURVE_KEYS", str(keys))
        namespace = build_parser().parse_args(args)
        CHECKS[namespace.command](namespace)


def test_roles_accept_their_settings(committed, monkeypatch, tmp_path):
    """What `folio <role>` checks before it starts (binds, CURVE on every TCP link, the
    model): each container passes, and without FOLIO_ALLOW_WILDCARD its wildcard bind
    would not."""
    from folio.shared.settings import SettingError

    _, documents = committed
    keys = tmp_path / "keys"
    generate_keys(keys)
    for _where, _pod, container in _containers(documents):
        if "--headless" not in container["args"]:
            _check_role(container, monkeypatch, keys)
    (frontend,) = _by_name(documents, "frontend")
    frontend = copy.deepcopy(frontend)
    frontend["env"] = [e for e in frontend["env"] if e["name"] != "FOLIO_ALLOW_WILDCARD"]
    with pytest.raises(SettingError, match="0.0.0.0"):
        _check_role(frontend, monkeypatch, keys)


def test_deployment_page_lists_every_manifest():
    """docs/deployment.md's table names each committed file with the command rendering it."""
    page = (ROOT / "docs/deployment.md").read_text()
    section = page.split("\n## Kubernetes\n", 1)[1].split("\n## ", 1)[0]
    for name, options in render.DEFAULTS.items():
        flags = render.command_line(options).removeprefix("python deploy/render.py")
        command = f"`...{flags}`" if flags else "`python deploy/render.py`"
        assert f"| `deploy/{name}` | {command} |" in section, name
