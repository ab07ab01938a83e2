"""The weight layout of the AVX-512 VNNI kernel (kernels/cpu/vnni_gemm.cpp), made once at load.

A tile is 16 output rows. Within a tile, each block of 32 K values is a run of 64-byte
loads, each holding 4 consecutive bytes of every one of the 16 rows (row-major within the
load): one vpdpbusd multiplies a load by 4 activation bytes broadcast to every lane.
- int8 (kernels/cpu_quant.py: q int8 [N, K]): 8 loads per block, bytes q + 128 (the kernel
  takes the 128 off per block: vpdpbusd multiplies unsigned by signed bytes).
- int4 (packed [N, K / 2], 16 bytes per block, byte i = value i | value i + 16 << 4): 4 loads
  per block, load l holding bytes 4l..4l+3 of the block; the kernel's low nibbles are values
  4l..4l+3 and its high nibbles values 16+4l..16+4l+3.
Scales (and int4 mins) go to [tiles, K / group, 16]. Rows past N are zero (scale 0).
"""

from __future__ import annotations

import functools

import torch

LANES = 16
BLOCK = 32


@functools.cache
def vnni_available() -> bool:
    """Whether the loaded CPU operators hold the VNNI kernel (a native build on a CPU with
    AVX-512 VNNI); callers check that the operators are loaded first."""
    return bool(torch.ops.folio.vnni_available())


def vnni_layout_fits(k: int, group: int) -> bool:
    return k % BLOCK == 0 and group % BLOCK == 0 and k % group == 0


def _pad_rows(t: torch.Tensor, rows: int) -> torch.Tensor:
    if t.shape[0] == rows:
        return t
    return torch.cat((t, t.new_zeros(rows - t.shape[0], *t.shape[1:])))


def _tiled(values: torch.Tensor, tiles: int) -> torch.Tensor:
    """[tiles * 16, G] -> [tiles, G, 16]."""
    return values.reshape(tiles, LANES, -1).transpose(1, 2).contiguous()


def repack(bits: int, data: torch.Tensor, scales: torch.Tensor,
           mins: torch.Tensor | None) -> list[torch.Tensor]:
    """[packed uint8 [tiles, bytes], scales [tiles, G, 16], (mins)] for the kernel."""
    n = data.shape[0]
    tiles = (n + LANES - 1) // LANES
    rows = tiles * LANES
    if bits == 8:
        unsigned = (data.to(torch.int16) + 128).to(torch.uint8)
        k = data.shape[1]
        loads = unsigned.reshape(n, k // BLOCK, 8, 4)
    else:
        k = data.shape[1] * 2
        loads = data.reshape(n, k // BLOCK, 4, 4)
    loads = _pad_rows(loads, rows)
    if bits == 8 and rows > n:
        loads[n:] = 128     # a zero weight
    # [tile, lane, block, load, byte] -> [tile, block, load, lane, byte]
    packed = loads.reshape(tiles, LANES, *loads.shape[1:]).permute(0, 2, 3, 1, 4)
    out = [packed.reshape(tiles, -1).contiguous(), _tiled(_pad_rows(scales.float(), rows), tiles)]
    if bits == 4:
        out.append(_tiled(_pad_rows(mins.float(), rows), tiles))
    return out
