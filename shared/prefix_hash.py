"""The prefix cache's block hash, shared by the scheduler (which registers and looks up
blocks) and the frontend's replica router (which remembers where a prefix was sent): both
must name a block of tokens the same way."""

from __future__ import annotations

import hashlib
import struct
from typing import Callable

_sha256 = hashlib.sha256
_NO_PARENT = b"\x00" * 32   # the first block's parent
# One compiled little-endian int64 packer per block length seen (a model has one block
# size; the router hashes the same lengths). Bounded: other lengths pack without caching.
_packers: dict[int, Callable[..., bytes]] = {}
_MAX_PACKERS = 64


def chain_hash(parent: bytes | None, token_ids: list[int]) -> bytes:
    """SHA-256 over the parent block's hash (32 zero bytes for the first block) and this
    block's token ids as little-endian int64s."""
    pack = _packers.get(len(token_ids))
    if pack is None:
        pack = _packer(len(token_ids))
    # One update of the concatenation: the same digest as two, one hash call fewer.
    return _sha256((parent or _NO_PARENT) + pack(*token_ids)).digest()


def _packer(count: int) -> Callable[..., bytes]:
    pack = struct.Struct(f"<{count}q").pack
    if len(_packers) < _MAX_PACKERS:
        _packers[count] = pack
    return pack


def full_block_hashes(token_ids: list[int], block_size: int, limit: int) -> list[bytes]:
    """The chained hashes of the first full blocks of `token_ids` (at most `limit`)."""
    hashes: list[bytes] = []
    parent = None
    for start in range(0, min(len(token_ids) // block_size, limit) * block_size, block_size):
        parent = chain_hash(parent, token_ids[start:start + block_size])
        hashes.append(parent)
    return hashes
