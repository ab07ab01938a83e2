"""Checks of Kubernetes manifests without a cluster.

- schema_errors: the Kubernetes API's own JSON schemas for a pinned version, strict (an
  unknown field is an error), from the kubernetes-validate package: its schema files are
  part of the wheel, nothing is fetched. A LeaderWorkerSet (a CRD, not in those schemas)
  gets a structural check of its own fields, and its two pod templates are validated as
  core/v1 PodTemplateSpec.
- lint: what the API server or the kubelet would refuse or silently get wrong that a
  schema cannot see: a container without an image, a probe or Service naming a port no
  container declares, a mount of no volume, a selector that matches no pod, an extended
  resource whose limit differs from its request, a $(VAR) the container does not define.
"""

from __future__ import annotations

import re
from collections.abc import Iterator

import jsonschema
import kubernetes_validate

K8S_VERSION = "1.33.0"
LWS_ENV = frozenset({"LWS_LEADER_ADDRESS", "LWS_GROUP_SIZE", "LWS_WORKER_INDEX"})

_INT32 = {"type": "integer", "minimum": 0, "maximum": 2**31 - 1}
# The LeaderWorkerSet's fields (leaderworkerset.x-k8s.io/v1), its pod templates aside.
LWS_SCHEMA = {
    "type": "object", "additionalProperties": False,
    "required": ["apiVersion", "kind", "metadata", "spec"],
    "properties": {
        "apiVersion": {"const": "leaderworkerset.x-k8s.io/v1"},
        "kind": {"const": "LeaderWorkerSet"},
        "metadata": {"type": "object", "required": ["name"]},
        "spec": {
            "type": "object", "additionalProperties": False,
            "required": ["leaderWorkerTemplate"],
            "properties": {
                "replicas": _INT32,
                "startupPolicy": {"enum": ["LeaderCreated", "LeaderReady"]},
                "rolloutStrategy": {"type": "object"},
                "networkConfig": {"type": "object"},
                "leaderWorkerTemplate": {
                    "type": "object", "additionalProperties": False,
                    "required": ["workerTemplate"],
                    "properties": {
                        "size": {**_INT32, "minimum": 1},
                        "restartPolicy": {"enum": ["Default", "RecreateGroupOnPodRestart",
                                                   "RecreateGroupAfterStart", "None"]},
                        "leaderTemplate": {"type": "object"},
                        "workerTemplate": {"type": "object"},
                        "subGroupPolicy": {"type": "object"},
                        "volumeClaimTemplates": {"type": "array"},
                        "persistentVolumeClaimRetentionPolicy": {"type": "object"},
                    },
                },
            },
        },
    },
}


def _k8s_errors(document: dict) -> list[str]:
    try:
        kubernetes_validate.validate(document, K8S_VERSION, strict=True)
    except kubernetes_validate.ValidationError as error:
        return [f"{document['kind']}/{'/'.join(map(str, error.path))}: {error.message}"]
    return []


def schema_errors(document: dict) -> list[str]:
    if document.get("kind") != "LeaderWorkerSet":
        return _k8s_errors(document)
    errors = [f"LeaderWorkerSet/{'/'.join(map(str, e.path))}: {e.message}"
              for e in jsonschema.Draft202012Validator(LWS_SCHEMA).iter_errors(document)]
    templates = document.get("spec", {}).get("leaderWorkerTemplate", {})
    for key in ("leaderTemplate", "workerTemplate"):
        if key in templates:
            errors += _k8s_errors({"apiVersion": "v1", "kind": "PodTemplate",
                                   "metadata": {"name": key.lower()},
                                   "template": templates[key]})
    return errors


def pod_templates(document: dict) -> Iterator[tuple[str, dict]]:
    """(where, PodTemplateSpec) of a Deployment, StatefulSet or LeaderWorkerSet."""
    spec = document.get("spec", {})
    if document["kind"] in ("Deployment", "StatefulSet"):
        yield f"{document['kind']}/{document['metadata']['name']}", spec["template"]
    elif document["kind"] == "LeaderWorkerSet":
        for key in ("leaderTemplate", "workerTemplate"):
            if key in spec["leaderWorkerTemplate"]:
                yield f"LeaderWorkerSet/{key}", spec["leaderWorkerTemplate"][key]


def _container_errors(where: str, container: dict, volumes: set[str],
                      injected: frozenset[str]) -> list[str]:
    where = f"{where}/{container.get('name')}"
    errors = [] if container.get("image") else [f"{where}: no image"]
    ports = {p.get("name") for p in container.get("ports", [])}
    for kind in ("startupProbe", "readinessProbe", "livenessProbe"):
        probe = container.get(kind, {})
        for handler in ("httpGet", "tcpSocket"):
            port = probe.get(handler, {}).get("port")
            if isinstance(port, str) and port not in ports:
                errors.append(f"{where}: {kind} names port {port!r}, not declared")
    errors += [f"{where}: mounts {m['name']!r}, no such volume"
               for m in container.get("volumeMounts", []) if m["name"] not in volumes]
    resources = container.get("resources", {})
    for name, amount in resources.get("requests", {}).items():
        if "/" in name and resources.get("limits", {}).get(name) != amount:
            errors.append(f"{where}: {name} limit differs from its request")
    defined = {e["name"] for e in container.get("env", [])} | injected
    for arg in [*container.get("command", []), *container.get("args", [])]:
        errors += [f"{where}: $({v}) is not defined" for v in
                   re.findall(r"\$\((\w+)\)", arg) if v not in defined]
    return errors


def lint(documents: list[dict]) -> list[str]:
    errors: list[str] = []
    templates: list[tuple[str, dict]] = []
    for document in documents:
        for where, template in pod_templates(document):
            templates.append((where, template))
            pod = template["spec"]
            volumes = {v["name"] for v in pod.get("volumes", [])}
            injected = LWS_ENV if where.startswith("LeaderWorkerSet") else frozenset()
            for container in [*pod.get("initContainers", []), *pod["containers"]]:
                errors += _container_errors(where, container, volumes, injected)
            if document["kind"] != "LeaderWorkerSet":
                selector = document["spec"]["selector"]["matchLabels"]
                labels = template["metadata"]["labels"]
                if any(labels.get(k) != v for k, v in selector.items()):
                    errors.append(f"{where}: its selector does not match its pods' labels")
    services = {d["metadata"]["name"]: d for d in documents if d["kind"] == "Service"}
    for name, service in services.items():
        selector = service["spec"]["selector"]
        matched = [t for _, t in templates if all(
            t["metadata"]["labels"].get(k) == v for k, v in selector.items())]
        if not matched:
            errors.append(f"Service/{name}: its selector matches no pod")
            continue
        declared = {p.get("name") for t in matched for c in t["spec"]["containers"]
                    for p in c.get("ports", [])}
        errors += [f"Service/{name}: targetPort {p['targetPort']!r} is no container's port"
                   for p in service["spec"]["ports"]
                   if isinstance(p.get("targetPort"), str) and p["targetPort"] not in declared]
    for document in documents:
        if document["kind"] == "StatefulSet":
            governing = services.get(document["spec"]["serviceName"])
            if governing is None or governing["spec"].get("clusterIP") != "None":
                errors.append(f"StatefulSet/{document['metadata']['name']}: serviceName is "
                              "not a headless Service here")
    return errors
