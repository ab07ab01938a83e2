"""Kernel tests run natively on CUDA, else on CPU through triton's interpreter.

TRITON_INTERPRET must be set before the kernel modules are imported (triton decides at
decoration time whether a @triton.jit function is compiled or interpreted), so it is set here,
at conftest import, before any test module imports them.
"""

from __future__ import annotations

import os

import pytest
import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")

pytest.importorskip("triton", reason="the Triton kernels need the triton package")

INTERPRETED = os.environ.get("TRITON_INTERPRET", "0").strip().lower() in ("1", "true", "on",
                                                                         "yes")
DEVICE = torch.device("cpu" if INTERPRETED else "cuda")


@pytest.fixture
def device() -> torch.device:
    return DEVICE
