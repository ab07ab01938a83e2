"""The paged KV cache: per layer, K and V of shape [num_blocks, block_size, kv_heads, width]
of the storage dtype (kernels/kv_quant.py: width is head_dim, or head_dim + 2 for int8 rows
ending with their scale); the host swap pool is laid out alike, so every per-block path
(swap, fork copies) moves rows and scales together.

Each layer's tensors have that layer's own KV heads and head size (Gemma 4's global layers
differ from its sliding ones), and one block id addresses the same tokens in every layer:
a block's bytes are the sum over the layers (ModelConfig.kv_block_bytes)."""

from __future__ import annotations

import torch

from folio.executor.model_config import ModelConfig
from folio.kernels.kv_quant import row_width

KVCaches = list[tuple[torch.Tensor, torch.Tensor]]


def bytes_per_block(config: ModelConfig, block_size: int, storage: torch.dtype) -> int:
    return config.kv_block_bytes(block_size,
                                 lambda dim: row_width(storage, dim) * storage.itemsize)


def allocate_kv_cache(config: ModelConfig, num_blocks: int, block_size: int,
                      storage: torch.dtype, device: torch.device) -> KVCaches:
    # torch.empty: pages are committed only when written, so a large CPU pool costs
    # memory in proportion to the tokens actually cached.
    return _allocate(config, num_blocks, block_size, storage, device=device)


def allocate_swap_pool(config: ModelConfig, num_blocks: int, block_size: int,
                       storage: torch.dtype, device: torch.device) -> KVCaches:
    """The host pool that `device`'s blocks are swapped out to, laid out as the KV cache."""
    pin = device.type == "cuda"   # pinned host memory makes non-blocking copies possible
    return _allocate(config, num_blocks, block_size, storage, pin_memory=pin)


def _allocate(config: ModelConfig, num_blocks: int, block_size: int, storage: torch.dtype,
              **where) -> KVCaches:
    caches = []
    for heads, dim in config.kv_cache_shapes:   # layers sharing another's cache have none
        shape = (num_blocks, block_size, heads, row_width(storage, dim))
        caches.append((torch.empty(shape, dtype=storage, **where),
                       torch.empty(shape, dtype=storage, **where)))
    return caches
