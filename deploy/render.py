"""Render Folio's Kubernetes manifests (docs/deployment.md, "Kubernetes").

    python deploy/render.py [--device gpu|cpu] [--replicas N] [--tensor-parallel-size N]
                            [--nodes N] [--image IMAGE] [--model-claim NAME |
                            --model-host-path DIR] [--model-path PATH] [--client NAME ...]
                            [-o FILE]
    python deploy/render.py --write-defaults     rewrite the committed deploy/*.yaml

One layout per shape, all with the same containers, probes, keys and model mount:

- one replica on one node: one pod holding the scheduler, the executor and the frontend
  (a Deployment and a Service);
- --replicas N: a frontend Deployment routing to N scheduler+executor pods (a StatefulSet,
  whose stable names the frontend's --scheduler-address lists);
- --nodes N: the same frontend routing to the leaders of a LeaderWorkerSet, each group one
  tensor-parallel executor spread over N pods (`folio executor --nnodes/--node-rank/
  --master-addr`, `--headless` on the workers; docs/deployment.md, "Across machines").

The committed manifests are this script's output for DEFAULTS (a test checks they are
current): edit the script and run --write-defaults, never the YAML.
"""

from __future__ import annotations

import argparse
import sys
from dataclasses import dataclass
from pathlib import Path

import yaml

HERE = Path(__file__).resolve().parent
KEYS_SECRET = "folio-curve-keys"     # `kubectl create secret generic ... --from-file=DIR/`
API_KEY_SECRET = "folio-api-key"     # optional: key `api-key`
HTTP_PORT, CLIENT_PORT, FRONTEND_LINK, EXECUTOR_LINK = 8000, 5555, 5556, 5557
SHUTDOWN_TIMEOUT_S = 30              # FOLIO_SHUTDOWN_TIMEOUT of frontend and scheduler
GRACE_S = SHUTDOWN_TIMEOUT_S + 15    # the drain, then the executor's own exit
MODEL_LOAD_S = 600                   # startup probes' budget: loading a large checkpoint
UID = 10001                          # the image's user (Dockerfile)
LWS_ENV = ("LWS_LEADER_ADDRESS", "LWS_GROUP_SIZE", "LWS_WORKER_INDEX")   # set by LWS


@dataclass(frozen=True)
class Options:
    device: str = "gpu"
    replicas: int = 1
    tensor_parallel_size: int = 1
    nodes: int = 1
    image: str = ""                  # "": folio:latest (gpu) or folio:cpu
    model_claim: str = "folio-models"
    model_host_path: str = ""        # instead of the claim
    model_path: str = "/models"
    clients: tuple[str, ...] = ("client",)
    name: str = "folio"

    def __post_init__(self) -> None:
        problems = [
            (self.device not in ("gpu", "cpu"), "--device must be gpu or cpu"),
            (self.replicas < 1, "--replicas must be at least 1"),
            (self.tensor_parallel_size < 1, "--tensor-parallel-size must be at least 1"),
            (self.nodes < 1, "--nodes must be at least 1"),
            (self.tensor_parallel_size % self.nodes != 0,
             "--tensor-parallel-size must be a multiple of --nodes (ranks per node)"),
            (self.nodes > 1 and self.device != "gpu",
             "--nodes above 1 needs --device gpu (ranks talk over NCCL)"),
            (self.model_path != "/models" and not self.model_path.startswith("/models/"),
             "--model-path must be under /models, where the model is mounted"),
            (not self.clients, "--client: at least one SDK client key"),
        ]
        for bad, message in problems:
            if bad:
                raise ValueError(message)

    @property
    def container_image(self) -> str:
        return self.image or ("folio:latest" if self.device == "gpu" else "folio:cpu")

    @property
    def ranks_per_pod(self) -> int:
        return self.tensor_parallel_size // self.nodes


# The committed manifests: file name -> options (docs/deployment.md lists them).
DEFAULTS: dict[str, Options] = {
    "folio-gpu.yaml": Options(),
    "folio-cpu.yaml": Options(device="cpu"),
    "folio-replicas-gpu.yaml": Options(replicas=2),
    "folio-multinode-gpu.yaml": Options(nodes=2, tensor_parallel_size=16),
}


# ---- containers ----------------------------------------------------------------------

def _env(pairs: dict[str, str]) -> list[dict]:
    return [{"name": k, "value": v} for k, v in pairs.items()]


def _exec_probe(role: str, period: int, failures: int) -> dict:
    """`folio probe` inside the container: the scheduler answers on its loopback port."""
    return {"exec": {"command": ["folio", "probe", role, f"tcp://127.0.0.1:{FRONTEND_LINK}",
                                 "--timeout", "3", "--curve-keys", "/keys"]},
            "periodSeconds": period, "timeoutSeconds": 10, "failureThreshold": failures}


def _http_probe(path: str, period: int, failures: int) -> dict:
    return {"httpGet": {"path": path, "port": "http"}, "periodSeconds": period,
            "timeoutSeconds": 5, "failureThreshold": failures}


def _security() -> dict:
    return {"allowPrivilegeEscalation": False, "capabilities": {"drop": ["ALL"]}}


def _mounts(keys_volume: str | None, model: bool) -> list[dict]:
    mounts = [{"name": keys_volume, "mountPath": "/keys", "readOnly": True}] \
        if keys_volume else []
    if model:
        mounts.append({"name": "model", "mountPath": "/models", "readOnly": True})
    return mounts


def scheduler_container(o: Options, frontend_bind: str) -> dict:
    """The scheduler binds the executor link on loopback (its executor shares the pod) and
    the frontend link on `frontend_bind` (loopback too when the frontend shares the pod)."""
    env = {"FOLIO_CURVE_KEYS": "/keys", "FOLIO_SHUTDOWN_TIMEOUT": str(SHUTDOWN_TIMEOUT_S),
           "FOLIO_LOG_LEVEL": "INFO"}
    if frontend_bind == "0.0.0.0":
        env["FOLIO_ALLOW_WILDCARD"] = "1"
    container = {
        "name": "scheduler", "image": o.container_image, "imagePullPolicy": "IfNotPresent",
        "args": ["scheduler", "--frontend-address", f"tcp://{frontend_bind}:{FRONTEND_LINK}",
                 "--executor-address", f"tcp://127.0.0.1:{EXECUTOR_LINK}"],
        "env": _env(env),
        "livenessProbe": _exec_probe("scheduler", 10, 3),
        "resources": {"requests": {"cpu": "1", "memory": "1Gi"}, "limits": {"memory": "2Gi"}},
        "securityContext": _security(),
        "volumeMounts": _mounts("keys-scheduler", model=False),
    }
    if frontend_bind == "0.0.0.0":
        container["ports"] = [{"name": "scheduler", "containerPort": FRONTEND_LINK}]
    return container


def _executor_resources(o: Options) -> dict:
    if o.device == "cpu":
        return {"requests": {"cpu": "4", "memory": "8Gi"}, "limits": {"memory": "16Gi"}}
    gpus = str(o.ranks_per_pod)   # one GPU per rank on this pod; limits must equal requests
    return {"requests": {"cpu": "4", "memory": "32Gi", "nvidia.com/gpu": gpus},
            "limits": {"memory": "64Gi", "nvidia.com/gpu": gpus}}


def _executor_args(o: Options, headless: bool) -> list[str]:
    args = ["executor"]
    if not headless:
        args += ["--scheduler-address", f"tcp://127.0.0.1:{EXECUTOR_LINK}"]
    args += ["--model", o.model_path, "--tensor-parallel-size", str(o.tensor_parallel_size)]
    if o.nodes > 1:
        args += ["--nnodes", "$(LWS_GROUP_SIZE)", "--node-rank", "$(LWS_WORKER_INDEX)",
                 "--master-addr", "$(LWS_LEADER_ADDRESS)"]
        if headless:
            args.append("--headless")
    return args


def executor_container(o: Options, headless: bool = False) -> dict:
    # Workers too: rank 0's plans reach them over TCP + CURVE with the executor keypair.
    env = {"FOLIO_LOG_LEVEL": "INFO", "FOLIO_CURVE_KEYS": "/keys"}
    if o.device == "cpu":
        env["FOLIO_DEVICE"] = "cpu"
    container = {
        "name": "executor", "image": o.container_image, "imagePullPolicy": "IfNotPresent",
        "args": _executor_args(o, headless), "env": _env(env),
        "resources": _executor_resources(o), "securityContext": _security(),
        "volumeMounts": [*_mounts("keys-executor", model=True),
                         {"name": "shm", "mountPath": "/dev/shm"}],
    }
    if not headless:
        # Attached to its scheduler: loading the checkpoint may take MODEL_LOAD_S.
        container["startupProbe"] = _exec_probe("executor", 10, MODEL_LOAD_S // 10)
        container["readinessProbe"] = _exec_probe("executor", 10, 3)
        # Longer than a scheduler restart, so the executor is not reloaded for one.
        container["livenessProbe"] = _exec_probe("executor", 10, 6)
        # SIGTERM reaches every container at once and the executor stops at once: it waits
        # here until the scheduler has drained its running requests and exited.
        wait = (f"for i in $(seq {GRACE_S}); do folio probe scheduler "
                f"tcp://127.0.0.1:{FRONTEND_LINK} --timeout 1 --curve-keys /keys "
                "> /dev/null || exit 0; sleep 1; done")
        container["lifecycle"] = {"preStop": {"exec": {"command": ["sh", "-c", wait]}}}
    return container


def frontend_container(o: Options, schedulers: list[str]) -> dict:
    env = {"FOLIO_CURVE_KEYS": "/keys", "FOLIO_ALLOW_WILDCARD": "1",
           "FOLIO_SHUTDOWN_TIMEOUT": str(SHUTDOWN_TIMEOUT_S), "FOLIO_SERVED_MODEL_NAME": "default",
           "FOLIO_LOG_LEVEL": "INFO"}
    return {
        "name": "frontend", "image": o.container_image, "imagePullPolicy": "IfNotPresent",
        "args": ["frontend", "--model", o.model_path,
                 "--scheduler-address", ",".join(schedulers),
                 "--client-address", f"tcp://0.0.0.0:{CLIENT_PORT}",
                 "--host", "0.0.0.0", "--port", str(HTTP_PORT)],
        "env": [*_env(env),
                {"name": "FOLIO_API_KEY", "valueFrom": {"secretKeyRef": {
                    "name": API_KEY_SECRET, "key": "api-key", "optional": True}}}],
        "ports": [{"name": "http", "containerPort": HTTP_PORT},
                  {"name": "zmq", "containerPort": CLIENT_PORT}],
        # /health is 200 once an executor serves: the startup probe covers the model load,
        # readiness takes the pod out of the Service while no replica serves or it drains.
        "startupProbe": _http_probe("/health", 10, MODEL_LOAD_S // 10),
        "readinessProbe": _http_probe("/health", 5, 2),
        # Liveness asks only whether the HTTP server answers ("/", the chat page): /health
        # is 503 while an executor reloads or the frontend drains, and restarting the
        # frontend helps neither.
        "livenessProbe": _http_probe("/", 10, 3),
        "resources": {"requests": {"cpu": "1", "memory": "2Gi"}, "limits": {"memory": "4Gi"}},
        "securityContext": _security(),
        "volumeMounts": _mounts("keys-frontend", model=True),
    }


# ---- volumes: keys and model ----------------------------------------------------------

def key_items(role: str, clients: tuple[str, ...]) -> list[str]:
    """The files of the keys Secret each container sees (`folio keys` writes them at the
    top of its directory; the allow-lists are remapped into their subdirectories). The
    scheduler's and executor's containers hold the frontend keypair for `folio probe`."""
    probe = ["server.key", "frontend.key_secret"]
    if role == "scheduler":
        return ["server.key_secret", *probe, "frontend.key:authorized_frontends/frontend.key",
                "executor.key:authorized_executors/executor.key"]
    if role == "executor":
        return ["executor.key_secret", *probe]
    # server.key too: with FOLIO_CLIENT_CURVE=0 the frontend loads only the public half.
    return ["server.key_secret", *probe,
            *[f"{c}.key:authorized_clients/{c}.key" for c in clients]]


def keys_volume(role: str, clients: tuple[str, ...]) -> dict:
    items = []
    for item in key_items(role, clients):
        key, _, path = item.partition(":")
        items.append({"key": key, "path": path or key})
    return {"name": f"keys-{role}", "secret": {
        "secretName": KEYS_SECRET, "items": items, "defaultMode": 0o440}}


def model_volume(o: Options) -> dict:
    if o.model_host_path:
        return {"name": "model", "hostPath": {"path": o.model_host_path, "type": "Directory"}}
    return {"name": "model", "persistentVolumeClaim": {"claimName": o.model_claim,
                                                       "readOnly": True}}


def shm_volume() -> dict:
    # NCCL and torch's rank processes share memory through /dev/shm (64 MiB by default).
    return {"name": "shm", "emptyDir": {"medium": "Memory", "sizeLimit": "8Gi"}}


# ---- pods and objects -----------------------------------------------------------------

def pod_spec(o: Options, containers: list[dict], roles: tuple[str, ...], model: bool) -> dict:
    volumes = [keys_volume(role, o.clients) for role in roles]
    if model:
        volumes.append(model_volume(o))
    if any(c["name"] == "executor" for c in containers):
        volumes.append(shm_volume())
    spec = {
        "terminationGracePeriodSeconds": GRACE_S,
        "securityContext": {"runAsNonRoot": True, "runAsUser": UID, "runAsGroup": UID,
                            "fsGroup": UID, "seccompProfile": {"type": "RuntimeDefault"}},
        "containers": containers,
        "volumes": volumes,
    }
    if o.device == "gpu" and any(c["name"] == "executor" for c in containers):
        spec["tolerations"] = [{"key": "nvidia.com/gpu", "operator": "Exists",
                                "effect": "NoSchedule"}]
    return spec


def _meta(o: Options, name: str, component: str) -> dict:
    return {"name": name, "labels": _labels(o, component)}


def _labels(o: Options, component: str) -> dict:
    return {"app.kubernetes.io/name": "folio", "app.kubernetes.io/instance": o.name,
            "app.kubernetes.io/component": component}


def frontend_service(o: Options, component: str) -> dict:
    return {"apiVersion": "v1", "kind": "Service", "metadata": _meta(o, o.name, component),
            "spec": {"type": "ClusterIP", "selector": _labels(o, component),
                     "ports": [{"name": "http", "port": HTTP_PORT, "targetPort": "http"},
                               {"name": "zmq", "port": CLIENT_PORT, "targetPort": "zmq"}]}}


def deployment(o: Options, name: str, component: str, spec: dict) -> dict:
    # A pod with the executor is replaced by Recreate: a rolling update would wait for a
    # second GPU (or set of them) that the old pod still holds.
    has_executor = any(c["name"] == "executor" for c in spec["containers"])
    return {"apiVersion": "apps/v1", "kind": "Deployment", "metadata": _meta(o, name, component),
            "spec": {"replicas": 1,
                     "strategy": {"type": "Recreate" if has_executor else "RollingUpdate"},
                     "selector": {"matchLabels": _labels(o, component)},
                     "template": {"metadata": {"labels": _labels(o, component)}, "spec": spec}}}


def single(o: Options) -> list[dict]:
    """Scheduler, executor and frontend in one pod, all links on its loopback."""
    containers = [scheduler_container(o, "127.0.0.1"), executor_container(o),
                  frontend_container(o, [f"tcp://127.0.0.1:{FRONTEND_LINK}"])]
    spec = pod_spec(o, containers, ("scheduler", "executor", "frontend"), model=True)
    return [deployment(o, o.name, "engine", spec), frontend_service(o, "engine")]


def frontend_deployment(o: Options, schedulers: list[str]) -> dict:
    spec = pod_spec(o, [frontend_container(o, schedulers)], ("frontend",), model=True)
    spec["terminationGracePeriodSeconds"] = SHUTDOWN_TIMEOUT_S + 10
    return deployment(o, f"{o.name}-frontend", "frontend", spec)


def replicas(o: Options) -> list[dict]:
    """A frontend Deployment and N scheduler+executor pods with stable DNS names."""
    name = f"{o.name}-replica"
    schedulers = [f"tcp://{name}-{i}.{name}:{FRONTEND_LINK}" for i in range(o.replicas)]
    spec = pod_spec(o, [scheduler_container(o, "0.0.0.0"), executor_container(o)],
                    ("scheduler", "executor"), model=True)
    headless = {"apiVersion": "v1", "kind": "Service", "metadata": _meta(o, name, "replica"),
                "spec": {"clusterIP": "None", "publishNotReadyAddresses": True,
                         "selector": _labels(o, "replica"),
                         "ports": [{"name": "scheduler", "port": FRONTEND_LINK,
                                    "targetPort": "scheduler"}]}}
    statefulset = {
        "apiVersion": "apps/v1", "kind": "StatefulSet", "metadata": _meta(o, name, "replica"),
        "spec": {"serviceName": name, "replicas": o.replicas,
                 "podManagementPolicy": "Parallel",   # replicas load their models at once
                 "selector": {"matchLabels": _labels(o, "replica")},
                 "template": {"metadata": {"labels": _labels(o, "replica")}, "spec": spec}}}
    return [frontend_deployment(o, schedulers), frontend_service(o, "frontend"),
            headless, statefulset]


def multinode(o: Options) -> list[dict]:
    """A frontend Deployment and a LeaderWorkerSet: each group is one tensor-parallel
    executor over `nodes` pods; its leader pod also runs the group's scheduler."""
    name = f"{o.name}-tp"
    # LWS's headless Service is named after it: the leader of group i is NAME-i.NAME.
    schedulers = [f"tcp://{name}-{i}.{name}:{FRONTEND_LINK}" for i in range(o.replicas)]
    leader = pod_spec(o, [scheduler_container(o, "0.0.0.0"), executor_container(o)],
                      ("scheduler", "executor"), model=True)
    worker = pod_spec(o, [executor_container(o, headless=True)], ("executor",), model=True)
    lws = {
        "apiVersion": "leaderworkerset.x-k8s.io/v1", "kind": "LeaderWorkerSet",
        "metadata": _meta(o, name, "tensor-parallel"),
        # LeaderCreated, not LeaderReady: the leader is ready only once its executor has
        # every rank, so it must not wait for readiness before the workers start.
        "spec": {"replicas": o.replicas, "startupPolicy": "LeaderCreated",
                 "leaderWorkerTemplate": {
                     "size": o.nodes,
                     # A lost rank breaks the whole group's collectives: start it anew.
                     "restartPolicy": "RecreateGroupOnPodRestart",
                     "leaderTemplate": {"metadata": {"labels": _labels(o, "tp-leader")},
                                        "spec": leader},
                     "workerTemplate": {"metadata": {"labels": _labels(o, "tp-worker")},
                                        "spec": worker}}}}
    return [frontend_deployment(o, schedulers), frontend_service(o, "frontend"), lws]


def render(o: Options) -> list[dict]:
    if o.nodes > 1:
        return multinode(o)
    return replicas(o) if o.replicas > 1 else single(o)


def command_line(o: Options) -> str:
    """The render.py flags that give `o` (those that differ from Options())."""
    base, parts = Options(), []
    for flag, attr in (("--device", "device"), ("--replicas", "replicas"),
                       ("--tensor-parallel-size", "tensor_parallel_size"), ("--nodes", "nodes"),
                       ("--image", "image"), ("--model-claim", "model_claim"),
                       ("--model-host-path", "model_host_path"), ("--model-path", "model_path"),
                       ("--name", "name")):
        if getattr(o, attr) != getattr(base, attr):
            parts += [flag, str(getattr(o, attr))]
    if o.clients != base.clients:
        parts += [f"--client {c}" for c in o.clients]
    return " ".join(["python deploy/render.py", *parts])


def to_yaml(o: Options) -> str:
    header = (f"# Folio on Kubernetes, rendered by `{command_line(o)}`\n"
              "# (docs/deployment.md, \"Kubernetes\"). Edit deploy/render.py, not this file.\n")
    return header + yaml.safe_dump_all(render(o), sort_keys=False, default_flow_style=False,
                                       width=100)


def parse_options(argv: list[str]) -> tuple[Options, argparse.Namespace]:
    p = argparse.ArgumentParser(description="Render Folio's Kubernetes manifests.")
    p.add_argument("--device", choices=("gpu", "cpu"), default="gpu")
    p.add_argument("--replicas", type=int, default=1,
                   help="data-parallel replicas behind one frontend")
    p.add_argument("--tensor-parallel-size", type=int, default=1, help="ranks per replica")
    p.add_argument("--nodes", type=int, default=1,
                   help="pods (nodes) per replica: above 1, a LeaderWorkerSet")
    p.add_argument("--image", default="", help="default: folio:latest, or folio:cpu")
    p.add_argument("--model-claim", default="folio-models",
                   help="PersistentVolumeClaim holding the checkpoint, mounted read-only")
    p.add_argument("--model-host-path", default="",
                   help="a directory on every node instead of the claim")
    p.add_argument("--model-path", default="/models",
                   help="the checkpoint inside the container (under /models)")
    p.add_argument("--client", action="append", dest="clients", metavar="NAME",
                   help="SDK client keys the frontend admits (repeatable; default: client)")
    p.add_argument("--name", default="folio", help="name prefix of every object")
    p.add_argument("-o", "--output", help="file to write (default: standard output)")
    p.add_argument("--write-defaults", action="store_true",
                   help="rewrite the committed deploy/*.yaml (DEFAULTS) and exit")
    args = p.parse_args(argv)
    try:
        o = Options(device=args.device, replicas=args.replicas,
                    tensor_parallel_size=args.tensor_parallel_size, nodes=args.nodes,
                    image=args.image, model_claim=args.model_claim,
                    model_host_path=args.model_host_path, model_path=args.model_path,
                    clients=tuple(args.clients or ("client",)), name=args.name)
    except ValueError as error:
        p.error(str(error))
    return o, args


def main(argv: list[str] | None = None) -> int:
    o, args = parse_options(sys.argv[1:] if argv is None else argv)
    if args.write_defaults:
        for filename, options in DEFAULTS.items():
            (HERE / filename).write_text(to_yaml(options))
            print(f"wrote deploy/{filename}")
        return 0
    text = to_yaml(o)
    if args.output:
        Path(args.output).write_text(text)
    else:
        sys.stdout.write(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
