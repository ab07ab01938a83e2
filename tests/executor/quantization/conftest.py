"""The quantized layers' tests run on the built CPU operators (without them, the layers
take a float fallback and the tests would check that instead)."""

from __future__ import annotations

import pytest


@pytest.fixture(scope="module")
def cpu_ops_built():
    from folio.kernels import cpu_attention

    if not cpu_attention.load().ok:
        cpu_attention.build()
