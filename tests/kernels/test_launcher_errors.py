"""Launchers reject bad arguments with a TypeError/ValueError that names the argument."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import torch

from folio import kernels
from folio.kernels import (AttentionConfig, fused_add_rms_norm, paged_attention, reshape_and_cache,
                     rms_norm, rotary_embedding)
from folio.kernels._launch import check_launch_device

REPO_ROOT = Path(__file__).resolve().parents[2]


def attention_args(device, **overrides):
    args = dict(
        query=torch.randn(3, 4, 32, device=device),
        key_cache=torch.randn(4, 16, 2, 32, device=device),
        value_cache=torch.randn(4, 16, 2, 32, device=device),
        block_tables=torch.zeros(2, 2, dtype=torch.int32, device=device),
        seq_lens=torch.tensor([5, 2], dtype=torch.int32, device=device),
        query_start_loc=torch.tensor([0, 1, 3], dtype=torch.int32, device=device),
        scale=0.125,
    )
    args.update(overrides)
    return args


def test_valid_attention_arguments_run(device):
    out = paged_attention(**attention_args(device))
    assert out.shape == (3, 4, 32)


@pytest.mark.parametrize("override, error, name", [
    (lambda d: {"query": torch.randn(3, 128, device=d)}, ValueError, "query"),
    (lambda d: {"query": torch.ones(3, 4, 32, dtype=torch.int32, device=d)}, TypeError, "query"),
    (lambda d: {"query": torch.randn(3, 32, 4, device=d).transpose(1, 2)}, ValueError, "query"),
    (lambda d: {"query": torch.randn(3, 3, 32, device=d)}, ValueError, "heads"),
    (lambda d: {"key_cache": torch.randn(4, 16, 2, 32, device=d).half()}, TypeError, "key_cache"),
    (lambda d: {"key_cache": torch.randn(4, 16, 2, 64, device=d)}, ValueError, "key_cache"),
    (lambda d: {"value_cache": torch.randn(4, 32, 2, 32, device=d)}, ValueError, "value_cache"),
    (lambda d: {"block_tables": torch.zeros(2, 2, device=d)}, TypeError, "block_tables"),
    (lambda d: {"block_tables": torch.zeros(3, 2, dtype=torch.int32, device=d)}, ValueError,
     "block_tables"),
    (lambda d: {"block_tables": torch.zeros(2, 2, dtype=torch.int32, device="meta")},
     ValueError, "block_tables"),
    (lambda d: {"seq_lens": torch.tensor([[5, 2]], device=d)}, ValueError, "seq_lens"),
    (lambda d: {"query_start_loc": torch.tensor([0, 3], device=d)}, ValueError,
     "query_start_loc"),
    (lambda d: {"query_start_loc": torch.tensor([0, 9, 1, 9, 3, 9], device=d)[::2]},
     ValueError, "query_start_loc must be contiguous"),
    (lambda d: {"scale": "0.1"}, TypeError, "scale"),
    (lambda d: {"scale": float("nan")}, TypeError, "scale"),
    (lambda d: {"out": torch.empty(3, 4, 16, device=d)}, ValueError, "out"),
    (lambda d: {"out": torch.empty(3, 4, 32, device=d).half()}, TypeError, "out"),
    (lambda d: {"config": AttentionConfig(block_m=8)}, ValueError, "block_m"),
    (lambda d: {"config": AttentionConfig(tile_size=24)}, ValueError, "tile_size"),
    (lambda d: {"config": AttentionConfig(num_splits=0)}, ValueError, "num_splits"),
    (lambda d: {"config": {"num_splits": 2}}, TypeError, "config"),
])
def test_attention_rejects(device, override, error, name):
    with pytest.raises(error, match=name):
        paged_attention(**attention_args(device, **override(device)))


def cache_args(device, **overrides):
    args = dict(key=torch.randn(3, 2, 32, device=device),
                value=torch.randn(3, 2, 32, device=device),
                key_cache=torch.zeros(2, 16, 2, 32, device=device),
                value_cache=torch.zeros(2, 16, 2, 32, device=device),
                slot_mapping=torch.tensor([0, 5, -1], device=device))
    args.update(overrides)
    return args


@pytest.mark.parametrize("override, error, name", [
    (lambda d: {"key": torch.randn(3, 64, device=d)}, ValueError, "key"),
    (lambda d: {"value": torch.randn(3, 2, 16, device=d)}, ValueError, "value"),
    (lambda d: {"key_cache": torch.zeros(2, 16, 4, 32, device=d)}, ValueError, "key_cache"),
    (lambda d: {"value_cache": torch.zeros(2, 16, 2, 32, dtype=torch.int8, device=d)},
     TypeError, "value_cache"),
    (lambda d: {"slot_mapping": torch.tensor([0.0, 5.0, -1.0], device=d)}, TypeError,
     "slot_mapping"),
    (lambda d: {"slot_mapping": torch.tensor([0, 5], device=d)}, ValueError, "slot_mapping"),
    (lambda d: {"key_cache": torch.zeros(2, 16, 2, 32, device="meta")}, ValueError,
     "key_cache"),
    (lambda d: {"key": torch.randn(3, 32, 2, device=d).transpose(1, 2)}, ValueError, "key"),
])
def test_reshape_and_cache_rejects(device, override, error, name):
    with pytest.raises(error, match=name):
        reshape_and_cache(**cache_args(device, **override(device)))


def test_norm_and_rotary_reject(device):
    x, weight = torch.randn(4, 64, device=device), torch.ones(64, device=device)
    with pytest.raises(ValueError, match="weight"):
        rms_norm(x, torch.ones(32, device=device), 1e-6)
    with pytest.raises(TypeError, match="residual"):
        rms_norm(x, weight, 1e-6, x.half())
    with pytest.raises(ValueError, match="residual"):
        fused_add_rms_norm(x, torch.randn(4, 32, device=device), weight, 1e-6)
    with pytest.raises(TypeError, match="eps"):
        rms_norm(x, weight, None)
    with pytest.raises(TypeError, match="x"):
        rms_norm(x.long(), weight, 1e-6)

    positions = torch.arange(3, device=device)
    q, k = torch.randn(3, 4, 32, device=device), torch.randn(3, 2, 32, device=device)
    cache = torch.randn(16, 32, device=device)
    with pytest.raises(ValueError, match="cos_sin_cache"):
        rotary_embedding(positions, q, k, torch.randn(16, 64, device=device))
    with pytest.raises(ValueError, match="head_dim"):
        rotary_embedding(positions, torch.randn(3, 4, 31, device=device),
                         torch.randn(3, 2, 31, device=device), torch.randn(16, 31, device=device))
    with pytest.raises(TypeError, match="key"):
        rotary_embedding(positions, q, k.half(), cache)
    with pytest.raises(ValueError, match="positions"):
        rotary_embedding(torch.arange(4, device=device), q, k, cache)
    with pytest.raises(TypeError, match="positions"):
        rotary_embedding(positions.float(), q, k, cache)


def test_compiled_kernels_need_cuda_tensors():
    """Outside the interpreter a CPU tensor is refused before any launch is attempted."""
    with pytest.raises(ValueError, match="query is on cpu.*CUDA"):
        check_launch_device("query", torch.zeros(1), kernel=object())


def test_importing_kernels_does_not_import_triton():
    code = ("import sys, kernels\n"
            "assert 'triton' not in sys.modules, 'triton imported eagerly'\n"
            "assert callable(kernels.paged_attention_ref)\n"
            "assert 'paged_attention' in dir(kernels)\n")
    subprocess.run([sys.executable, "-c", code], cwd=REPO_ROOT, check=True, timeout=120)


def test_lazy_exports(device):
    assert kernels.paged_attention is paged_attention
    assert kernels.triton_available(device)
    with pytest.raises(AttributeError, match="no_such_kernel"):
        kernels.no_such_kernel
