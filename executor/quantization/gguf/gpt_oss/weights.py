"""A gpt-oss GGUF file's tensors put back as the Hugging Face checkpoint holds them (float32,
one at a time), undoing llama.cpp's converter:

- the experts' gate_up_proj [E, H, 2I] (gate and up interleaved in its columns) is written
  as two tensors, gate = columns 0::2 and up = 1::2, each transposed to [E, I, H]: they are
  transposed back and interleaved again (their biases, [E, I] each, interleaved likewise);
- down_proj [E, I, H] is written transposed, [E, H, I]: transposed back;
- an MXFP4 expert weight (the checkpoint's *_blocks / *_scales, which the converter repacks
  into ggml's blocks: the E8M0 scale byte first, then value i in the low nibble of byte i
  and value i + 16 in its high nibble, where the checkpoint packs values 2j and 2j + 1 in
  byte j) is multiplied out by gguf.quants: 2^(e - 127) times the E2M1 value, exactly what
  the checkpoint's blocks dequantize to (executor/models/gpt_oss/mxfp4.py). Like the
  checkpoint's, they are not kept in 4 bits (docs/models.md says why);
- the sinks are `attn_sinks.weight` (names.py)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import numpy as np
import torch

from folio.executor.quantization.gguf.gpt_oss.names import gpt_oss_hf_name

_HALVES = {"ffn_gate_exps": 0, "ffn_up_exps": 1}


def iterate_gpt_oss_weights(reader: Any) -> Iterator[tuple[str, torch.Tensor]]:
    from gguf.quants import dequantize

    pending: dict[str, tuple[int, np.ndarray]] = {}   # a fused name -> the half read first
    for tensor in reader.tensors:
        name = gpt_oss_hf_name(tensor.name)
        if name is None:   # refused already by open_gguf's checks (validate.py)
            raise ValueError(f"GGUF tensor {tensor.name!r} has no place in Folio's gpt-oss")
        values = dequantize(tensor.data, tensor.tensor_type).astype(np.float32, copy=False)
        half = _HALVES.get(tensor.name.split(".")[-2])   # blk.N.<module>.<kind>
        if half is not None:
            if tensor.name.endswith(".weight"):
                values = values.transpose(0, 2, 1)   # [E, I, H] -> [E, H, I]
            other = pending.pop(name, None)
            if other is None:
                pending[name] = (half, values)
                continue
            halves = (values, other[1]) if half == 0 else (other[1], values)
            values = interleave(*halves)
        elif tensor.name.endswith("ffn_down_exps.weight"):
            values = values.transpose(0, 2, 1)       # [E, H, I] -> [E, I, H]
        values = np.ascontiguousarray(values)
        if not values.flags.writeable:   # an F32 tensor is a view of the read-only map
            values = values.copy()
        yield name, torch.from_numpy(values)
    if pending:
        raise ValueError(f"GGUF gpt-oss file: {', '.join(sorted(pending))} has only one of "
                         "its ffn_gate_exps / ffn_up_exps halves")


def interleave(gate: np.ndarray, up: np.ndarray) -> np.ndarray:
    """gate_up's last axis, gate in the even places and up in the odd ones."""
    fused = np.empty((*gate.shape[:-1], 2 * gate.shape[-1]), dtype=np.float32)
    fused[..., 0::2], fused[..., 1::2] = gate, up
    return fused
