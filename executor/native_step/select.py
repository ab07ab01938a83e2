"""Whether a model's small steps run the native step (decided once, at load) and the log line
that says so, or which model feature keeps the Python layers: decoders' (native_step/step.py),
hybrids' (native_step/hybrid.py) and Gemma 4's (native_step/gemma4.py)."""

from __future__ import annotations

import logging

import torch

from folio.executor.models.decoder import CausalLM
from folio.executor.models.gemma4.model import Gemma4CausalLM
from folio.executor.models.hybrid.model import HybridCausalLM
from folio.executor.native_step.gemma4 import Gemma4NativeStep, gemma4_layers_reason
from folio.executor.native_step.hybrid import HybridNativeStep, hybrid_layers_reason
from folio.executor.native_step.layers import unsupported_module
from folio.executor.native_step.step import NativeStep
from folio.executor.ops import KernelOps
from folio.kernels import cpu_attention
from folio.shared.config import DECODE_STEPS

log = logging.getLogger("folio.executor")

# Its gain is the Python between the operators, the same whatever the rows: larger steps
# (prompts, big batches) spend their time in the matmuls and keep the layer loop.
MAX_TOKENS = 16


def setup_reason(ops: KernelOps, device: torch.device, dtype: torch.dtype,
                 tensor_parallel: bool = False, lora: bool = False) -> str | None:
    """Why no native step can run here whatever the model (decoder or hybrid), or None."""
    if device.type != "cpu":
        return f"the device is {device.type}"
    status = cpu_attention.load()
    if not status.ok:
        return "the C++ CPU operators are not built"
    if ops.name != "cpu":
        return f"{ops.name} attention kernels"
    if dtype not in (torch.float32, torch.bfloat16):
        return f"{str(dtype).removeprefix('torch.')} weights"
    if tensor_parallel:
        return "tensor parallel"
    if lora:
        return "LoRA adapters"
    return None


def python_layers_reason(model: CausalLM, ops: KernelOps, device: torch.device,
                         dtype: torch.dtype, tensor_parallel: bool = False,
                         lora_step=None) -> str | None:
    """Why `model` keeps the Python layers, or None when the native step can run it.
    `lora_step`: the LoRA registry's step, when adapters are on (the native step then runs
    the steps without adapter rows)."""
    reason = setup_reason(ops, device, dtype, tensor_parallel)
    if reason is not None:
        return reason
    config = model.config
    if config.gemma:
        return "Gemma norms"
    if config.moe is not None:
        return "MoE layers"
    if config.hidden_act != "silu":
        return f"a {config.hidden_act} MLP"
    if config.rope.rope_type == "longrope":
        return "longrope positions"
    # Issue 39's attention-only families: options DecodeStep does not reproduce.
    if config.rope_layers:
        return "layers without rotary"
    if config.norms != "pre":
        return "post-sublayer norms"
    if config.qk_norm_whole:
        return "q/k norms over all heads"
    if config.attention_sinks:
        return "attention sinks"
    if "yarn" in (config.rope.rope_type, getattr(config.local_rope, "rope_type", None)):
        return "yarn rotary"
    return unsupported_module(model, lora_step)


def select_decode_step(model: CausalLM | HybridCausalLM | Gemma4CausalLM, setting: str,
                       ops: KernelOps, device: torch.device, dtype: torch.dtype,
                       tensor_parallel: bool = False
                       ) -> NativeStep | HybridNativeStep | Gemma4NativeStep | None:
    """The native step for `model` (engine setting decode_step: "auto" where it can run,
    "python" never): a NativeStep for a decoder, a HybridNativeStep for a hybrid, a
    Gemma4NativeStep for Gemma 4; or None:
    the layer loop runs every step. With LoRA adapters on (the registry set the model's
    lora_step), a decoder's step runs the steps without adapter rows."""
    if setting not in DECODE_STEPS:
        raise ValueError(f"decode_step must be one of {', '.join(DECODE_STEPS)}, got "
                         f"{setting!r}")
    lora_step = getattr(model, "lora_step", None)   # executor/lora/registry.py sets it
    lora = lora_step is not None
    hybrid = isinstance(model, HybridCausalLM)
    gemma4 = isinstance(model, Gemma4CausalLM)
    if setting == "python":
        reason = "decode_step='python'"
    elif hybrid:
        reason = (setup_reason(ops, device, dtype, tensor_parallel, lora)
                  or hybrid_layers_reason(model))
    elif gemma4:
        reason = (setup_reason(ops, device, dtype, tensor_parallel, lora)
                  or gemma4_layers_reason(model))
    else:
        reason = python_layers_reason(model, ops, device, dtype, tensor_parallel, lora_step)
    if reason is not None:
        log.info("decode step: Python layers (%s)", reason)
        return None
    if hybrid:
        step = HybridNativeStep(model, MAX_TOKENS)
        log.info("decode step: native, one C++ call for the layers of decode-only steps of "
                 "up to %d sequences (hybrid: %s)", MAX_TOKENS, model.config.hybrid.family)
        return step
    if gemma4:
        step = Gemma4NativeStep(model, MAX_TOKENS)
        log.info("decode step: native, one C++ call for the layers of steps of up to %d "
                 "tokens (Gemma 4)", MAX_TOKENS)
        return step
    step = NativeStep(model, MAX_TOKENS)
    log.info("decode step: native, one C++ call for the layers of steps of up to %d tokens%s",
             MAX_TOKENS, " without adapter rows" if lora_step is not None else "")
    return step
