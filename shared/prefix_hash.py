"""The prefix cache's block hash, shared by the scheduler (which registers and looks up
blocks) and the frontend's replica router (which remembers where a prefix was sent): both
must name a block of tokens the same way."""

from __future__ import annotations

import functools
import hashlib
import struct
from typing import Callable

_NO_PARENT = b"\x00" * 32   # the first block's parent


def chain_hash(parent: bytes | None, token_ids: list[int]) -> bytes:
    """SHA-256 over the parent block's hash (32 zero bytes for the first block) and this
    block's token ids as little-endian int64s."""
    # One update of the concatenation: the same digest as two, one hash call fewer.
    return hashlib.sha256((parent or _NO_PARENT) + _packer(len(token_ids))(*token_ids)).digest()


@functools.lru_cache(maxsize=64)   # a model has one block size; the router hashes the same
def _packer(count: int) -> Callable[..., bytes]:
    """A compiled little-endian int64 packer for `count` ids."""
    return struct.Struct(f"<{count}q").pack


def adapter_seed(lora: str | None, generation: int = 0) -> bytes | None:
    """The first block's parent for a request run with LoRA adapter `lora` (None: the base
    model, whose chains start from no parent): the adapter's name, and how many times that
    name was unloaded before, are in every hash of its chain, so two adapters (or an adapter
    and one loaded later under its name) never share a block."""
    if lora is None:
        return None
    return hashlib.sha256(b"folio-lora\x00" + lora.encode() + b"\x00"
                          + str(generation).encode()).digest()


def full_block_hashes(token_ids: list[int], block_size: int, limit: int,
                      seed: bytes | None = None) -> list[bytes]:
    """The chained hashes of the first full blocks of `token_ids` (at most `limit`);
    `seed`: the first block's parent (adapter_seed)."""
    hashes: list[bytes] = []
    parent = seed
    for start in range(0, min(len(token_ids) // block_size, limit) * block_size, block_size):
        parent = chain_hash(parent, token_ids[start:start + block_size])
        hashes.append(parent)
    return hashes
