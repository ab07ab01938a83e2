"""Kernel tests run natively on CUDA, else on CPU through triton's interpreter.

TRITON_INTERPRET must be set before the kernel modules are imported (triton decides at
decoration time whether a @triton.jit function is compiled or interpreted), so it is set here,
at conftest import, before any test module imports them.
"""

from __future__ import annotations

import os
import platform

import pytest
import torch

from folio.kernels import cpu_attention

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")

pytest.importorskip("triton", reason="the Triton kernels need the triton package")

INTERPRETED = os.environ.get("TRITON_INTERPRET", "0").strip().lower() in ("1", "true", "on",
                                                                         "yes")
DEVICE = torch.device("cpu" if INTERPRETED else "cuda")


@pytest.fixture
def device() -> torch.device:
    return DEVICE


@pytest.fixture(scope="session")
def cpu_ops_built():
    """setup.sh builds the CPU operators (kernels/cpu/); build them here if they are missing,
    and fail (not skip) on the platform CI runs on when they cannot be built."""
    status = cpu_attention.load()
    if not status.ok:
        try:
            cpu_attention.build()
        except Exception as exc:  # noqa: BLE001 -- any build failure is reported the same way
            status = cpu_attention.LoadStatus(False, f"{status.detail}; building failed: {exc}")
        else:
            status = cpu_attention.load()
    if not status.ok:
        if platform.system() == "Linux" and platform.machine() == "x86_64":
            pytest.fail(f"the CPU operators are unavailable: {status.detail}")
        pytest.skip(f"the CPU operators are unavailable here: {status.detail}")
