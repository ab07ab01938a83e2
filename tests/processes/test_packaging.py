"""Folio installs one import name, `folio`: the top-level folders (frontend/, scheduler/,
executor/, kernels/, shared/) are its subpackages, so another project's `kernels` or `shared`
installed beside it is left alone and never stitched into ours."""

from __future__ import annotations

import ast
import json
import os
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from tests.pipeline import ROOT

SUBPACKAGES = ("frontend", "scheduler", "executor", "kernels", "shared")


@pytest.fixture(scope="module")
def wheel(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("wheel")
    # No build isolation: the venv's setuptools builds it, nothing is downloaded.
    subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation",
                    "--disable-pip-version-check", "-q", "-w", str(out), str(ROOT)],
                   check=True, capture_output=True, timeout=300)
    [built] = out.glob("folio-*.whl")
    return built


def test_the_wheel_holds_folio_alone(wheel):
    with zipfile.ZipFile(wheel) as archive:
        names = archive.namelist()
        [top_level] = [n for n in names if n.endswith(".dist-info/top_level.txt")]
        assert archive.read(top_level).decode().split() == ["folio"]
    assert {n.split("/")[0] for n in names} == {"folio", top_level.split("/")[0]}
    for sub in SUBPACKAGES:
        assert f"folio/{sub}/__init__.py" in names
    # Package data travels under the new names too.
    assert "folio/kernels/cpu/paged_attention.cpp" in names
    assert any(n.startswith("folio/frontend/static/") for n in names)
    assert any(n.startswith("folio/default_model/weights/") for n in names)


def test_the_installed_wheel_imports_from_itself(wheel, tmp_path):
    target = tmp_path / "site"
    subprocess.run([sys.executable, "-m", "pip", "install", "--no-deps", "--no-index",
                    "--disable-pip-version-check", "-q", "--target", str(target), str(wheel)],
                   check=True, capture_output=True, timeout=300)
    assert sorted(p.name for p in target.iterdir() if not p.name.endswith(".dist-info")) \
        in (["folio"], ["bin", "folio"])
    probe = ("import json, folio.frontend.openai_api, folio.scheduler.scheduler, "
             "folio.executor.executor, folio.kernels.cpu_attention, folio.shared.messages, sys;"
             "print(json.dumps({m: sys.modules[m].__file__ for m in sys.modules"
             " if m == 'folio' or m.startswith('folio.')}))")
    out = subprocess.run([sys.executable, "-c", probe], check=True, capture_output=True,
                         text=True, cwd=tmp_path, timeout=120,
                         env={**os.environ, "PYTHONPATH": str(target)}).stdout
    files = json.loads(out)
    assert len(files) > 10
    assert all(f.startswith(str(target)) for f in files.values()), files


def test_hugging_face_kernels_beside_folio(llama_dir, tmp_path):
    """Hugging Face's `kernels` (installed by the test extras) stays itself, Folio's kernels
    stay ours, and an engine runs in the process that imported both."""
    script = f"""
import json, kernels
from folio import LLM, SamplingParams
import folio.kernels
llm = LLM({str(llama_dir)!r}, device="cpu", dtype="float32")
[out] = llm.generate([[1, 2, 3, 4]], SamplingParams(max_tokens=4, temperature=0.0))
print(json.dumps({{"hf": kernels.__file__, "ours": folio.kernels.__file__,
                  "hf_has_ours": hasattr(kernels, "cpu_attention"),
                  "tokens": out.outputs[0].token_ids}}))
"""
    out = subprocess.run([sys.executable, "-c", script], check=True, capture_output=True,
                         text=True, cwd=tmp_path, timeout=300).stdout
    seen = json.loads(out.splitlines()[-1])
    assert Path(seen["hf"]).parent.parent.name == "site-packages"
    assert seen["ours"] == str(ROOT / "kernels" / "__init__.py")
    assert not seen["hf_has_ours"]
    assert len(seen["tokens"]) == 4


def _import_graph() -> dict[str, set[str]]:
    """Every module of Folio and bench/ and the modules of ours it imports, at any depth of
    its code (an import inside a function closes a circle as surely as one at the top)."""
    files = {}
    for folder in ("folio", *SUBPACKAGES, "bench"):
        for path in (ROOT / folder).rglob("*.py"):
            parts = list(path.relative_to(ROOT).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts.pop()
            files[".".join(["folio", *parts] if parts[0] in SUBPACKAGES else parts)] = path
    graph = {}
    for name, path in files.items():
        named = set()
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                named |= {node.module, *(f"{node.module}.{a.name}" for a in node.names)}
            elif isinstance(node, ast.Import):
                named |= {a.name for a in node.names}
        graph[name] = {n for n in named if n in files and n != name}
    return graph


def test_no_import_circles():
    graph = _import_graph()
    assert len(graph) > 100 and "folio.scheduler.scheduler" in graph
    done: set[str] = set()

    def visit(module: str, path: list[str]) -> None:
        if module in path:
            raise AssertionError("import circle: " + " -> ".join(
                path[path.index(module):] + [module]))
        if module in done:
            return
        for imported in sorted(graph[module]):
            visit(imported, path + [module])
        done.add(module)

    for module in sorted(graph):
        visit(module, [])
