"""The CPU operators (kernels/cpu/: paged attention, fused norm/rotary, the hybrids' recurrent
steps and the delta rule's prompts): build, load, call.

It is built once at setup time (`python -m folio.kernels.cpu_attention --build`, run by
scripts/setup.sh) into $FOLIO_CPU_OPS_DIR, else `.folio-cache/cpu-ops/` beside this package.
The build's name hashes the source, the compiler flags and the torch version, so at run time
`load()` only loads a library that matches them, never compiles, and says why when it cannot.
"""

from __future__ import annotations

import argparse
import functools
import hashlib
import os
import platform
import shutil
from dataclasses import dataclass
from pathlib import Path

import torch

SOURCE = Path(__file__).parent / "cpu" / "paged_attention.cpp"
SOURCES = (SOURCE, Path(__file__).parent / "cpu" / "fused_ops.cpp",
           Path(__file__).parent / "cpu" / "kv_write.cpp",
           Path(__file__).parent / "cpu" / "quant_matmul.cpp",
           Path(__file__).parent / "cpu" / "quant_dot.cpp",
           Path(__file__).parent / "cpu" / "weight_only_linear.cpp",
           Path(__file__).parent / "cpu" / "vnni_gemm.cpp",
           Path(__file__).parent / "cpu" / "bf16_gemm.cpp",
           Path(__file__).parent / "cpu" / "decode_step.cpp",
           Path(__file__).parent / "cpu" / "gated_delta.cpp",
           Path(__file__).parent / "cpu" / "gated_delta_chunk.cpp",
           Path(__file__).parent / "cpu" / "short_conv.cpp",
           Path(__file__).parent / "cpu" / "hybrid_step.cpp",
           Path(__file__).parent / "cpu" / "gemma4_step.cpp",
           Path(__file__).parent / "cpu" / "lora_segments.cpp")
HEADERS = (Path(__file__).parent / "cpu" / "vec_math.h",
           Path(__file__).parent / "cpu" / "quant_weights.h",
           Path(__file__).parent / "cpu" / "vnni_gemm.h",
           Path(__file__).parent / "cpu" / "attention_tiles.h",
           Path(__file__).parent / "cpu" / "state_slots.h",
           Path(__file__).parent / "cpu" / "delta_rule_args.h",
           Path(__file__).parent / "cpu" / "step_linear.h")   # hashed with the sources
# -fopenmp: at::parallel_for is an inline `omp parallel` (torch's own libgomp.so.1 serves it,
# already loaded). ISO C++ mode turns FMA contraction off; the kernel wants it.
_FLAGS = ("-O3", "-fopenmp", "-ffp-contract=fast")
_X86 = platform.machine() in ("x86_64", "AMD64")
# "native" is for building on the machine that serves (setup.sh); "portable" for images
# that may run elsewhere (the Dockerfile): on x86 it needs AVX2/FMA (x86-64-v3, checked
# before loading), since GCC's code for the baseline (SSE2) is about 2x slower on prompts.
# load() prefers native when both exist.
VARIANTS = {"native": _FLAGS + ("-march=native",),
            "portable": _FLAGS + (("-march=x86-64-v3",) if _X86 else ())}
_X86_64_V3_FLAGS = {"avx2", "fma", "f16c", "bmi2", "movbe"}


def build_dir() -> Path:
    configured = os.environ.get("FOLIO_CPU_OPS_DIR")
    if configured:
        return Path(configured)
    return Path(__file__).resolve().parent.parent / ".folio-cache" / "cpu-ops"


def extension_name(variant: str) -> str:
    digest = hashlib.sha256(b"".join(source.read_bytes() for source in (*SOURCES, *HEADERS)))
    # A native build is for this CPU's features: on another CPU (a copied checkout) its
    # name differs, so it is "not built" rather than an illegal instruction.
    cpu = " ".join(sorted(_cpu_flags())) if variant == "native" else ""
    for part in (*VARIANTS[variant], torch.__version__, platform.machine(), cpu):
        digest.update(b"\0" + part.encode())
    return f"folio_cpu_ops_{variant}_{digest.hexdigest()[:12]}"


def library_path(variant: str) -> Path:
    name = extension_name(variant)
    return build_dir() / name / f"{name}.so"


def build(variant: str = "native", verbose: bool = False) -> Path:
    """Compile (ninja skips it when up to date) and load the library; returns its path."""
    from torch.utils import cpp_extension

    name = extension_name(variant)
    directory = build_dir() / name
    directory.mkdir(parents=True, exist_ok=True)
    cpp_extension.load(name, [str(source) for source in SOURCES], extra_cflags=list(VARIANTS[variant]),
                       extra_ldflags=["-fopenmp"], build_directory=str(directory),
                       is_python_module=False,
                       verbose=verbose)
    for stale in directory.parent.glob(f"folio_cpu_ops_{variant}_*"):
        if stale != directory:        # builds of older sources or another torch
            shutil.rmtree(stale, ignore_errors=True)
    load.cache_clear()
    return directory / f"{name}.so"


@dataclass(frozen=True)
class LoadStatus:
    ok: bool
    detail: str          # the library's path, or why it is unavailable


@functools.cache
def load() -> LoadStatus:
    """Load a prebuilt library for this source and torch; never compiles."""
    missing = [str(source) for source in (*SOURCES, *HEADERS) if not source.exists()]
    if missing:
        return LoadStatus(False, f"{', '.join(missing)} missing")
    for variant in VARIANTS:
        path = library_path(variant)
        if path.exists() and variant == "portable" and not _cpu_runs_x86_64_v3():
            return LoadStatus(False, f"{path} needs AVX2 and FMA (x86-64-v3); this CPU lacks "
                                     f"them (build --variant native here)")
        if path.exists():
            try:
                torch.ops.load_library(str(path))
            except (OSError, RuntimeError) as exc:
                return LoadStatus(False, f"loading {path} failed: {exc}")
            return LoadStatus(True, str(path))
    stale = sorted(str(path.parent.name) for path in build_dir().glob("folio_cpu_ops_*/*.so"))
    if stale:   # kernels/cpu/, torch or the CPU changed since setup: easy to miss, say so
        return LoadStatus(False, f"the build in {build_dir()} ({', '.join(stale)}) is of an "
                                 f"older source, another torch or another CPU; rebuild it: "
                                 f"scripts/setup.sh or python -m folio.kernels.cpu_attention --build")
    return LoadStatus(False, f"no build for this source and torch {torch.__version__} in "
                             f"{build_dir()} (build it: python -m folio.kernels.cpu_attention --build)")


def _cpu_flags() -> set[str]:
    try:
        with open("/proc/cpuinfo") as info:
            return set(next((line.split(":", 1)[1].split() for line in info
                             if line.startswith(("flags", "Features"))), []))
    except OSError:
        return set()            # not Linux


def _cpu_runs_x86_64_v3() -> bool:
    if not _X86:
        return True             # the portable build has no -march there
    flags = _cpu_flags()
    return not flags or _X86_64_V3_FLAGS <= flags    # no /proc/cpuinfo: trust the build


def paged_attention_cpu(query: torch.Tensor, key_cache: torch.Tensor,
                        value_cache: torch.Tensor, block_tables: torch.Tensor,
                        seq_lens: torch.Tensor, query_start_loc: torch.Tensor, scale: float,
                        out: torch.Tensor | None = None, *, window: int | None = None,
                        softcap: float | None = None,
                        sinks: torch.Tensor | None = None) -> torch.Tensor:
    """Same meaning as reference.paged_attention_ref (window, softcap and sinks included; blocks
    wholly before a query's window are skipped, not read); float32 or bfloat16 CPU queries;
    the caches in the query's dtype, bfloat16, int8 or float8 (kernels/kv_quant.py)."""
    if window is not None or softcap is not None or sinks is not None:
        from folio.kernels.reference import check_attention_options   # ~0.7 us a call

        check_attention_options(window, softcap, sinks, query.shape[1])
    status = load()
    if not status.ok:
        raise RuntimeError(f"the CPU attention operator is unavailable: {status.detail}")
    if out is None:
        out = torch.empty_like(query)
    # The operator's 0 means "none" for both.
    if sinks is not None:
        torch.ops.folio.paged_attention_sinks(out, query, key_cache, value_cache, block_tables,
                                              seq_lens, query_start_loc, float(scale),
                                              int(window or 0), float(softcap or 0.0),
                                              sinks.float().contiguous())
        return out
    torch.ops.folio.paged_attention(out, query, key_cache, value_cache, block_tables, seq_lens,
                                    query_start_loc, float(scale), int(window or 0),
                                    float(softcap or 0.0))
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--build", action="store_true", help="compile the operator")
    parser.add_argument("--variant", choices=tuple(VARIANTS), default="native")
    parser.add_argument("--verbose", action="store_true")
    args = parser.parse_args()
    if args.build:
        print(f"built {build(args.variant, args.verbose)}")
    status = load()
    print(f"CPU attention operator: {status.detail}" if status.ok else
          f"CPU attention operator unavailable: {status.detail}")
    # A portable build may be made on a machine that cannot load it (an image's builder).
    raise SystemExit(0 if status.ok or args.build else 1)


if __name__ == "__main__":
    main()
