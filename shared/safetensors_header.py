"""A safetensors file's header read without torch (start-up checks of checkpoints and LoRA
adapters, before any process starts): every entry's shape, and every tensor's bytes
inside the file. Files are opened as regular files only, and read size-bounded, so a FIFO,
a device or a huge header is refused instead of blocking or filling memory."""

from __future__ import annotations

import json
import os
import stat
import struct
from pathlib import Path
from typing import BinaryIO

MAX_HEADER = 100 * 2**20   # safetensors' own limit on the JSON header

_KINDS = ((stat.S_ISDIR, "a directory"), (stat.S_ISFIFO, "a FIFO"),
          (stat.S_ISCHR, "a character device"), (stat.S_ISBLK, "a block device"),
          (stat.S_ISSOCK, "a socket"))


class SafetensorsError(ValueError):
    """Why the file is not a readable safetensors file."""


def open_regular(file: Path) -> BinaryIO:
    """`file` opened for reading if it is (or a symlink resolves to) a regular file; else
    OSError naming what it is. O_NONBLOCK: opening a FIFO must not wait for a writer, and
    the type is checked on the opened descriptor, so a swap after a check cannot slip in."""
    fd = os.open(file, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_CLOEXEC", 0))
    try:
        mode = os.fstat(fd).st_mode
        if not stat.S_ISREG(mode):
            kind = next((name for test, name in _KINDS if test(mode)), "something else")
            raise OSError(f"it is {kind}, not a regular file")
        return os.fdopen(fd, "rb")
    except BaseException:
        os.close(fd)
        raise


def read_shapes(file: Path, max_header: int = MAX_HEADER) -> dict[str, tuple[int, ...]]:
    """Tensor name -> shape; SafetensorsError naming the reason when the header does not
    parse, is over `max_header` bytes or a tensor's bytes lie past the end of the file."""
    try:
        with open_regular(file) as handle:
            size = os.fstat(handle.fileno()).st_size
            (length,) = struct.unpack("<Q", handle.read(8))
            if length > max_header:
                raise SafetensorsError(f"header of {length} bytes, over the {max_header} "
                                       "this reads")
            if not 2 <= length <= size - 8:
                raise SafetensorsError(f"header length {length}")
            header = json.loads(handle.read(length))
    except SafetensorsError:
        raise
    except RecursionError:   # the JSON scanner's own depth guard
        raise SafetensorsError("header nested too deeply") from None
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
        if any(n < 0 for n in shapes[name]):
            raise SafetensorsError(f"{name} has shape {list(shapes[name])}")
        end = max(end, stop)
    if 8 + length + end > size:
        raise SafetensorsError(f"truncated: {size} bytes, tensors need {8 + length + end}")
    return shapes
