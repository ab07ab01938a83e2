"""--dtype auto: which type the executor serves a checkpoint in."""

from __future__ import annotations

import platform

import pytest
import torch

from folio.executor import executor
from folio.executor.executor import resolve_dtype

CPU = torch.device("cpu")


@pytest.mark.parametrize("native, checkpoint, served", [
    (True, "bfloat16", torch.bfloat16),
    (True, "float16", torch.bfloat16),
    (True, "float32", torch.float32),
    (False, "bfloat16", torch.float32),
    (False, "float16", torch.float32),
])
def test_cpu_auto_serves_half_precision_checkpoints_in_bfloat16_where_native(
        monkeypatch, native, checkpoint, served):
    monkeypatch.setattr(executor, "cpu_multiplies_bfloat16", lambda: native)
    assert resolve_dtype("auto", checkpoint, CPU) == served


def test_an_explicit_dtype_wins_over_the_checkpoints():
    assert resolve_dtype("float32", "bfloat16", CPU) == torch.float32
    assert resolve_dtype("bfloat16", "float32", CPU) == torch.bfloat16


@pytest.mark.skipif(platform.machine() != "x86_64", reason="reads x86 CPU flags")
def test_native_bfloat16_follows_the_cpus_own_flags():
    with open("/proc/cpuinfo") as info:
        flags = set(next(line for line in info if line.startswith("flags")).split(":")[1].split())
    assert executor.cpu_multiplies_bfloat16() == bool(flags & {"avx512_bf16", "amx_bf16"})
