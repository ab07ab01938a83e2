"""The prefix cache's block hash, shared by the scheduler (which registers and looks up
blocks) and the frontend's replica router (which remembers where a prefix was sent): both
must name a block of tokens the same way."""

from __future__ import annotations

import hashlib
import struct


def chain_hash(parent: bytes | None, token_ids: list[int]) -> bytes:
    """SHA-256 over the parent block's hash and this block's token ids."""
    digest = hashlib.sha256(parent or b"\x00" * 32)
    digest.update(struct.pack(f"<{len(token_ids)}q", *token_ids))
    return digest.digest()


def full_block_hashes(token_ids: list[int], block_size: int, limit: int) -> list[bytes]:
    """The chained hashes of the first full blocks of `token_ids` (at most `limit`)."""
    hashes: list[bytes] = []
    parent = None
    for start in range(0, min(len(token_ids) // block_size, limit) * block_size, block_size):
        parent = chain_hash(parent, token_ids[start:start + block_size])
        hashes.append(parent)
    return hashes
