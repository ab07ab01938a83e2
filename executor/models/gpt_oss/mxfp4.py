"""The MXFP4 experts of gpt-oss's released checkpoints, dequantized as they stream in.

A weight W [E, out, in] is stored as `<name>_blocks` [E, out, in/32, 16] uint8 (two 4-bit
E2M1 values a byte, the low nibble first) and `<name>_scales` [E, out, in/32] uint8 (an E8M0
power of two per 32 values, biased by 127). Folio multiplies them out once at load into the
model dtype and the transformers layout [E, in, out] (executor/models/gpt_oss/moe.py):
docs/models.md says why it does not keep them in 4 bits.
"""

from __future__ import annotations

from collections.abc import Iterator

import torch

# E2M1: sign, 2 exponent bits, 1 mantissa bit.
_E2M1 = (0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0,
         -0.0, -0.5, -1.0, -1.5, -2.0, -3.0, -4.0, -6.0)
_BLOCKS, _SCALES = "_blocks", "_scales"


def dequantize_mxfp4(blocks: torch.Tensor, scales: torch.Tensor) -> torch.Tensor:
    """[E, out, G, 16] uint8 blocks and [E, out, G] uint8 scales -> [E, G * 32, out] float32."""
    if blocks.dtype != torch.uint8 or scales.dtype != torch.uint8:
        raise ValueError(f"MXFP4 blocks and scales must be uint8, got {blocks.dtype} and "
                         f"{scales.dtype}")
    if blocks.dim() != 4 or blocks.shape[-1] != 16 or blocks.shape[:-1] != scales.shape:
        raise ValueError(f"MXFP4 blocks {tuple(blocks.shape)} and scales "
                         f"{tuple(scales.shape)} do not match ([E, out, G, 16] and [E, out, G])")
    table = torch.tensor(_E2M1, dtype=torch.float32)
    values = torch.stack((table[(blocks & 0x0F).long()], table[(blocks >> 4).long()]), dim=-1)
    values = values.flatten(-2)                                      # [E, out, G, 32]
    values = torch.ldexp(values, scales.to(torch.int32)[..., None] - 127)
    return values.flatten(-2).transpose(1, 2).contiguous()


def dequantize_stream(weights: Iterator[tuple[str, torch.Tensor]]
                      ) -> Iterator[tuple[str, torch.Tensor]]:
    """The checkpoint's tensors with each blocks/scales pair replaced by the dequantized
    weight under the pair's name; a pair left incomplete is an error naming it."""
    pending: dict[str, tuple[str, torch.Tensor]] = {}
    for name, tensor in weights:
        if not name.endswith((_BLOCKS, _SCALES)):
            yield name, tensor
            continue
        base, kind = name[:-len(_BLOCKS)], name[-len(_BLOCKS):]
        other = pending.pop(base, None)
        if other is None:
            pending[base] = (kind, tensor)
            continue
        blocks, scales = (tensor, other[1]) if kind == _BLOCKS else (other[1], tensor)
        yield base, dequantize_mxfp4(blocks, scales)
    if pending:
        raise ValueError(f"MXFP4 checkpoint: {', '.join(sorted(pending))} lack their "
                         f"{'/'.join(sorted({_BLOCKS, _SCALES}))} partner")
