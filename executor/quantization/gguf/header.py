"""A bounded reader of a GGUF file's header: metadata and tensor infos, every count, length
and offset checked against the file's size before anything is allocated (no torch import).

gguf.GGUFReader parses the whole header eagerly, a numpy view per array item, so a crafted
count makes it allocate gigabytes; open_gguf runs this reader first and only hands a file
that passed it to GGUFReader. Arrays are not kept (only their item type and count): the
checks need their lengths, and GGUFReader reads the values once the file is known sound.
"""

from __future__ import annotations

import math
import mmap
import struct
from dataclasses import dataclass
from pathlib import Path
from typing import Any

GGUF_MAGIC = b"GGUF"
VERSIONS = (2, 3)             # 64-bit counts; version 1 (32-bit) is long gone
DEFAULT_ALIGNMENT = 32
MAX_DIMS = 4                  # ggml's GGML_MAX_DIMS
# Far above any real file (a 405B llama holds ~1,100 tensors and ~50 keys; the largest
# vocabularies ~260k tokens, merges ~500k), far below what GGUFReader's per-item views
# make of a file's worth of tiny items.
MAX_TENSORS = 65536
MAX_KEYS = 65536
MAX_ARRAY_ITEMS = 2**21
MAX_TOTAL_ARRAY_ITEMS = 2**22

STRING, ARRAY = 8, 9
SCALARS = {0: "<B", 1: "<b", 2: "<H", 3: "<h", 4: "<I", 5: "<i", 6: "<f", 7: "<?",
           10: "<Q", 11: "<q", 12: "<d"}
INTEGERS = frozenset({0, 1, 2, 3, 4, 5, 10, 11})
FLOATS = frozenset({6, 12})
_MIN_KV_BYTES = 8 + 4 + 1            # empty key, type, one-byte value
_MIN_TENSOR_INFO_BYTES = 8 + 4 + 8 + 4 + 8   # empty name, 1 dim, type, offset


class GgufFormatError(ValueError):
    """A header that is not a sound GGUF; the message names the field."""


@dataclass(frozen=True)
class GgufArray:
    item_type: int
    count: int


@dataclass(frozen=True)
class GgufValue:
    type: int        # GGUF value type (SCALARS, STRING or ARRAY)
    value: Any       # a number, a str, or a GgufArray


@dataclass(frozen=True)
class GgufTensorInfo:
    name: str
    dims: tuple[int, ...]   # innermost first, as the file lists them
    type_name: str
    offset: int             # from the data section's start
    n_bytes: int


@dataclass(frozen=True)
class GgufHeader:
    metadata: dict[str, GgufValue]
    tensors: tuple[GgufTensorInfo, ...]
    data_start: int
    file_size: int


class _Cursor:
    """Reads little-endian values from a buffer, refusing any read past its end."""

    def __init__(self, buffer: Any, size: int):
        self.buffer, self.size, self.at = buffer, size, 0

    def left(self) -> int:
        return self.size - self.at

    def take(self, count: int, what: str) -> int:
        """Skips `count` bytes; their start."""
        if count > self.left():
            raise GgufFormatError(f"{what} needs {count} bytes, past the end of the file "
                                  f"({self.left()} left)")
        start, self.at = self.at, self.at + count
        return start

    def unpack(self, fmt: str, what: str) -> Any:
        start = self.take(struct.calcsize(fmt), what)
        return struct.unpack_from(fmt, self.buffer, start)[0]

    def length(self, what: str) -> int:
        """A string's uint64 length, bounded by the bytes left."""
        count = self.unpack("<Q", what)
        if count > self.left():
            raise GgufFormatError(f"{what} declares a {count}-byte string, more than the "
                                  f"file's {self.left()} remaining bytes")
        return count

    def text(self, what: str) -> str:
        start = self.take(self.length(what), what)
        try:
            return bytes(self.buffer[start:self.at]).decode("utf-8")
        except UnicodeDecodeError:
            raise GgufFormatError(f"{what} is not UTF-8") from None


def read_gguf_header(path: str | Path) -> GgufHeader:
    """The header of the GGUF file at `path`; GgufFormatError naming the field otherwise."""
    path = Path(path)
    size = path.stat().st_size
    if size < 4 + 4 + 8 + 8:
        raise GgufFormatError(f"{size} bytes is too short for a GGUF header")
    with path.open("rb") as handle, mmap.mmap(handle.fileno(), 0,
                                               access=mmap.ACCESS_READ) as buffer:
        return _read(_Cursor(buffer, size))


def _read(cursor: _Cursor) -> GgufHeader:
    if bytes(cursor.buffer[0:4]) != GGUF_MAGIC:
        raise GgufFormatError("no GGUF magic (the file does not start with b'GGUF')")
    cursor.take(4, "magic")
    version = cursor.unpack("<I", "version")
    if version not in VERSIONS:
        raise GgufFormatError(f"GGUF version {version} is not supported (Folio reads "
                              f"{' and '.join(map(str, VERSIONS))})")
    tensor_count = cursor.unpack("<Q", "tensor_count")
    kv_count = cursor.unpack("<Q", "kv_count")
    _bound_count("kv_count", kv_count, MAX_KEYS, cursor.left() // _MIN_KV_BYTES)
    _bound_count("tensor_count", tensor_count, MAX_TENSORS,
                 cursor.left() // _MIN_TENSOR_INFO_BYTES)
    metadata = _read_metadata(cursor, kv_count)
    alignment = _alignment(metadata)
    infos = [_read_tensor_info(cursor, index, alignment) for index in range(tensor_count)]
    data_start = -(-cursor.at // alignment) * alignment
    tensors = tuple(infos)
    _check_tensor_data(tensors, cursor.size - data_start)
    return GgufHeader(metadata, tensors, data_start, cursor.size)


def _bound_count(what: str, count: int, limit: int, fits: int) -> None:
    if count > min(limit, fits):
        raise GgufFormatError(f"{what} is {count}: more than the file's size holds ({fits}) "
                              f"or Folio reads ({limit})")


def _read_metadata(cursor: _Cursor, kv_count: int) -> dict[str, GgufValue]:
    metadata: dict[str, GgufValue] = {}
    items = [0]   # array items so far, bounded across all arrays
    for index in range(kv_count):
        key = cursor.text(f"metadata key #{index}")
        if key in metadata:
            raise GgufFormatError(f"metadata key {key!r} appears twice")
        value_type = cursor.unpack("<I", key)
        metadata[key] = GgufValue(value_type, _read_value(cursor, key, value_type, items))
    return metadata


def _read_value(cursor: _Cursor, key: str, value_type: int, items: list[int]) -> Any:
    if value_type in SCALARS:
        return cursor.unpack(SCALARS[value_type], key)
    if value_type == STRING:
        return cursor.text(key)
    if value_type == ARRAY:
        return _read_array(cursor, key, items)
    raise GgufFormatError(f"metadata {key} has unknown value type {value_type}")


def _read_array(cursor: _Cursor, key: str, items: list[int]) -> GgufArray:
    item_type = cursor.unpack("<I", key)
    count = cursor.unpack("<Q", key)
    if item_type == ARRAY:
        raise GgufFormatError(f"metadata {key} is an array of arrays (not supported)")
    if item_type not in SCALARS and item_type != STRING:
        raise GgufFormatError(f"metadata {key} is an array of unknown type {item_type}")
    # An item takes at least its own size (a string: its 8-byte length).
    item_bytes = 8 if item_type == STRING else struct.calcsize(SCALARS[item_type])
    _bound_count(f"metadata {key}'s item count", count, MAX_ARRAY_ITEMS,
                 cursor.left() // item_bytes)
    items[0] += count
    if items[0] > MAX_TOTAL_ARRAY_ITEMS:
        raise GgufFormatError(f"metadata {key}: the arrays hold more than "
                              f"{MAX_TOTAL_ARRAY_ITEMS} items in all")
    if item_type == STRING:
        _skip_strings(cursor, key, count)
    else:
        cursor.take(count * item_bytes, key)
    return GgufArray(item_type, count)


def _skip_strings(cursor: _Cursor, key: str, count: int) -> None:
    """Walks `count` strings (a vocabulary's worth is hundreds of thousands: the message is
    only formatted for the one that does not fit)."""
    unpack = struct.Struct("<Q").unpack_from
    buffer, size, at = cursor.buffer, cursor.size, cursor.at
    for index in range(count):
        if at + 8 > size or at + 8 + unpack(buffer, at)[0] > size:
            cursor.at = at
            cursor.take(cursor.length(f"{key}[{index}]"), f"{key}[{index}]")   # raises
        at += 8 + unpack(buffer, at)[0]
    cursor.at = at


def _alignment(metadata: dict[str, GgufValue]) -> int:
    entry = metadata.get("general.alignment")
    if entry is None:
        return DEFAULT_ALIGNMENT
    if entry.type != 4 or entry.value <= 0 or entry.value & (entry.value - 1):
        raise GgufFormatError(f"general.alignment must be a uint32 power of two, not "
                              f"{entry.value!r}")
    return entry.value


def _read_tensor_info(cursor: _Cursor, index: int, alignment: int) -> GgufTensorInfo:
    from gguf.constants import GGML_QUANT_SIZES, GGMLQuantizationType

    name = cursor.text(f"tensor #{index}'s name")
    n_dims = cursor.unpack("<I", f"tensor {name}'s dimension count")
    if not 1 <= n_dims <= MAX_DIMS:
        raise GgufFormatError(f"tensor {name} has {n_dims} dimensions (1 to {MAX_DIMS})")
    dims = tuple(cursor.unpack("<Q", f"tensor {name}'s dims") for _ in range(n_dims))
    code = cursor.unpack("<I", f"tensor {name}'s type")
    offset = cursor.unpack("<Q", f"tensor {name}'s offset")
    try:
        kind = GGMLQuantizationType(code)
        block, block_bytes = GGML_QUANT_SIZES[kind]
    except (ValueError, KeyError):
        raise GgufFormatError(f"tensor {name} has unknown GGML type {code}") from None
    if min(dims) < 1:
        raise GgufFormatError(f"tensor {name} has a zero dimension {list(dims)}")
    if dims[0] % block:
        raise GgufFormatError(f"tensor {name}'s rows ({dims[0]}) are not whole {kind.name} "
                              f"blocks of {block}")
    if offset % alignment:
        raise GgufFormatError(f"tensor {name}'s offset {offset} is not aligned to "
                              f"{alignment}")
    n_bytes = math.prod(dims) // block * block_bytes   # Python ints: no wrap-around
    return GgufTensorInfo(name, dims, kind.name, offset, n_bytes)


def _check_tensor_data(tensors: tuple[GgufTensorInfo, ...], data_size: int) -> None:
    """Every tensor's bytes inside the data section, no two sharing a byte, no name twice."""
    names = set()
    end, previous = 0, None
    for tensor in sorted(tensors, key=lambda tensor: tensor.offset):
        if tensor.name in names:
            raise GgufFormatError(f"tensor {tensor.name} appears twice")
        names.add(tensor.name)
        if tensor.offset + tensor.n_bytes > data_size:
            raise GgufFormatError(f"the file is truncated: tensor {tensor.name} ends past "
                                  f"its data section ({max(data_size, 0)} bytes)")
        if tensor.offset < end:
            raise GgufFormatError(f"tensor {tensor.name}'s data overlaps {previous}'s")
        end, previous = tensor.offset + tensor.n_bytes, tensor.name
