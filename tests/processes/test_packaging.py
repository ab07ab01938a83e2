"""Folio installs one import name, `folio`: the top-level folders (frontend/, scheduler/,
executor/, kernels/, shared/) are its subpackages, so another project's `kernels` or `shared`
installed beside it is left alone and never stitched into ours."""

from __future__ import annotations

import ast
import json
import os
import re
import shlex
import subprocess
import sys
import sysconfig
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
    assert any(n.startswith("folio/frontend/http/static/") for n in names)
    assert any(n.startswith("folio/default_model/weights/") for n in names)


def test_the_installed_wheel_imports_from_itself(wheel, tmp_path):
    target = tmp_path / "site"
    subprocess.run([sys.executable, "-m", "pip", "install", "--no-deps", "--no-index",
                    "--disable-pip-version-check", "-q", "--target", str(target), str(wheel)],
                   check=True, capture_output=True, timeout=300)
    assert sorted(p.name for p in target.iterdir() if not p.name.endswith(".dist-info")) \
        in (["folio"], ["bin", "folio"])
    probe = ("import json, folio.frontend.openai.completions, folio.scheduler.scheduler, "
             "folio.executor.executor, folio.kernels.cpu_attention, folio.shared.protocol.messages, sys;"
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


def _dockerfile_module_steps() -> list[list[str]]:
    """Each distinct `python -m folio…` command in the Dockerfile's RUN steps, as argv."""
    text = re.sub(r"\\\n\s*", " ", (ROOT / "Dockerfile").read_text())
    steps: list[list[str]] = []
    for line in text.splitlines():
        if line.strip().startswith("RUN "):
            for found in re.finditer(r"python -m (folio[\w.]*[^;&|]*)", line):
                argv = shlex.split(found.group(1))
                if argv not in steps:
                    steps.append(argv)
    return steps


@pytest.fixture(scope="module")
def fresh_env(wheel, tmp_path_factory) -> Path:
    """A new virtual environment holding the built wheel (not editable) and, through a .pth
    line, the test environment's third-party packages, whose own .pth files (the editable
    install's import hook among them) stay unread."""
    env = tmp_path_factory.mktemp("fresh") / "env"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(env)], check=True,
                   timeout=120)
    [site] = (env / "lib").glob("python3*/site-packages")
    (site / "deps.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
    subprocess.run([sys.executable, "-m", "pip", "install", "--no-deps", "--no-index",
                    "--disable-pip-version-check", "-q", "--target", str(site), str(wheel)],
                   check=True, capture_output=True, timeout=300)
    return env / "bin" / "python"


def test_the_dockerfile_steps_run_from_a_source_tree(fresh_env, tmp_path):
    """The image installs the wheel, then runs `python -m folio…` steps in a working directory;
    run here as it once was, where the source tree lies (its bare `folio/` folder first on
    the path), each step's module must still be found with every subpackage, and take the
    step's arguments. (Each module's --help, not the step itself: the portable operator's
    compile would take half a minute of the suite; tests/kernels build and run it.)"""
    steps = _dockerfile_module_steps()
    assert ["folio.kernels.cpu_attention", "--build", "--variant", "portable"] in steps
    where = subprocess.run([str(fresh_env), "-c", "import folio.kernels; print(folio.kernels.__file__)"],
                           capture_output=True, text=True, cwd=tmp_path, timeout=120)
    assert "/site-packages/folio/kernels/" in where.stdout, where.stderr   # the wheel's own
    for module, *args in steps:
        out = subprocess.run([str(fresh_env), "-m", module, "--help"], capture_output=True,
                             text=True, cwd=ROOT, timeout=120)
        assert out.returncode == 0, f"python -m {module}:\n{out.stderr[-3000:]}"
        for arg in args:
            assert arg in out.stdout, f"python -m {module} takes no {arg!r}"


def test_the_bare_kernels_folder_imports_cleanly_from_the_root(fresh_env):
    """Another program started at the repository root that imports a `kernels` (transformers
    probing Hugging Face's) finds this folder first: it imports, and refuses names it lacks
    with an ImportError, which such probes catch."""
    probe = ("import kernels\n"
             "try:\n    from kernels import get_kernel\nexcept ImportError:\n    print('refused')\n")
    out = subprocess.run([str(fresh_env), "-c", probe], capture_output=True, text=True,
                         cwd=ROOT, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["refused"]
