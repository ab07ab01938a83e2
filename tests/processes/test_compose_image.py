"""`docker compose up` as a user runs it: the CPU image built from this checkout, the three
services started by compose.yaml + compose.cpu.yaml, one chat completion served. Needs a
Docker engine (skipped, with the reason, where none answers); tests/processes/test_packaging.py
checks the image's build steps without one."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import urllib.request
from pathlib import Path

import pytest

from tests.http_server import free_port
from tests.pipeline import ROOT


def _engine_problem() -> str | None:
    if shutil.which("docker") is None:
        return "no docker command"
    info = subprocess.run(["docker", "info"], capture_output=True, text=True, timeout=60)
    if info.returncode != 0:
        return "no Docker engine answers: " + (info.stderr.strip().splitlines() or ["?"])[-1]
    return None


@pytest.mark.slow
def test_compose_serves_a_chat_completion_from_the_cpu_image(tmp_path: Path):
    problem = _engine_problem()
    if problem:
        pytest.skip(problem)
    models = tmp_path / "models"
    shutil.copytree(ROOT / "folio" / "default_model" / "weights", models / "default")
    http_port = free_port()
    env = {**os.environ, "FOLIO_MODEL_DIR": str(models / "default"),
           "FOLIO_HTTP_PORT": str(http_port), "FOLIO_ZMQ_PORT": str(free_port()),
           "COMPOSE_PROJECT_NAME": f"foliotest{http_port}"}
    compose = ["docker", "compose", "-f", "compose.yaml", "-f", "compose.cpu.yaml"]
    build = subprocess.run([*compose, "build"], cwd=ROOT, env=env, capture_output=True,
                           text=True, timeout=3600)
    assert build.returncode == 0, build.stdout[-3000:] + build.stderr[-3000:]
    try:
        up = subprocess.run([*compose, "up", "-d", "--wait"], cwd=ROOT, env=env,
                            capture_output=True, text=True, timeout=900)
        assert up.returncode == 0, up.stderr[-3000:]
        body = json.dumps({"model": "default", "max_tokens": 8, "temperature": 0,
                           "messages": [{"role": "user", "content": "Hello"}]}).encode()
        request = urllib.request.Request(f"http://127.0.0.1:{http_port}/v1/chat/completions",
                                         data=body,
                                         headers={"Content-Type": "application/json"})
        with urllib.request.urlopen(request, timeout=300) as answer:
            reply = json.load(answer)
        assert reply["choices"][0]["message"]["content"]
        assert reply["usage"]["completion_tokens"] > 0
    finally:
        subprocess.run([*compose, "down", "-v", "--timeout", "60"], cwd=ROOT, env=env,
                       capture_output=True, timeout=600)
