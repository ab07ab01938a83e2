"""A safetensors file's header read without torch (start-up checks of checkpoints and LoRA
adapters, before any process starts): every entry's shape, and every tensor's bytes
inside the file."""

from __future__ import annotations

import json
import struct
from pathlib import Path

MAX_HEADER = 100 * 2**20   # safetensors' own limit on the JSON header


class SafetensorsError(ValueError):
    """Why the file is not a readable safetensors file."""


def read_shapes(file: Path) -> dict[str, tuple[int, ...]]:
    """Tensor name -> shape; SafetensorsError naming the reason when the header does not
    parse or a tensor's bytes lie past the end of the file."""
    try:
        size = file.stat().st_size
        with file.open("rb") as handle:
            (length,) = struct.unpack("<Q", handle.read(8))
            if not 2 <= length <= min(MAX_HEADER, size - 8):
                raise SafetensorsError(f"header length {length}")
            header = json.loads(handle.read(length))
    except SafetensorsError:
        raise
    except (OSError, struct.error, ValueError) as error:
        raise SafetensorsError(str(error)) from None
    if not isinstance(header, dict):
        raise SafetensorsError("header is not a JSON object")
    shapes, end = {}, 0
    for name, entry in header.items():
        if name == "__metadata__":
            continue
        try:
            begin, stop = (int(x) for x in entry["data_offsets"])
            shapes[name] = tuple(int(x) for x in entry["shape"])
        except (KeyError, IndexError, TypeError, ValueError):
            raise SafetensorsError("a tensor entry has no data_offsets or shape") from None
        if not 0 <= begin <= stop:
            raise SafetensorsError(f"{name} has data_offsets {begin}..{stop}")
        end = max(end, stop)
    if 8 + length + end > size:
        raise SafetensorsError(f"truncated: {size} bytes, tensors need {8 + length + end}")
    return shapes
