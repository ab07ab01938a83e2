"""What the native step tests share: a model built as the executor builds it and its native
step, and an engine with its start-up log's decode-step lines."""

from __future__ import annotations

import logging

import pytest
import torch

from folio import LLM
from folio.executor.linear import pack_linears
from folio.executor.model_loader import load_model
from folio.executor.models.hf_config import read_model_config
from folio.executor.native_step import select_decode_step
from folio.executor.ops import KernelOps, select_ops
from folio.kernels import cpu_attention

CPU = torch.device("cpu")
# The native steps are C++ operators: without the library (scripts/setup.sh builds it) the
# tests that run them skip.
needs_cpu_operators = pytest.mark.skipif(not cpu_attention.load().ok,
                                         reason="the C++ CPU operators are not built")


def executor_model(path, dtype: torch.dtype, max_positions: int, quantization: str = "none",
                   backend: str = "auto") -> tuple[torch.nn.Module, KernelOps]:
    """The model as the executor builds it (C++ kernels, linears packed or quantized), and
    the kernel set it runs on."""
    ops = select_ops("cpu", CPU)
    model = load_model(path, read_model_config(path), ops, dtype, CPU, max_positions)
    pack_linears(model, CPU, dtype, backend, quantization, int8_activations=True)
    return model, ops


def native_step(model, ops: KernelOps, dtype: torch.dtype):
    """The model's native step, which it must have."""
    step = select_decode_step(model, "auto", ops, CPU, dtype)
    assert step is not None
    return step


def engine_and_step_lines(path, caplog, **engine_args) -> tuple[LLM, list[str]]:
    """An engine on the CPU, and the "decode step" lines its start-up logged."""
    caplog.clear()
    with caplog.at_level(logging.INFO, logger="folio.executor"):
        llm = LLM(str(path), skip_tokenizer_init=True, device="cpu", num_kv_blocks=64,
                  **engine_args)
    lines = [r.getMessage() for r in caplog.records if r.getMessage().startswith("decode step")]
    return llm, lines
