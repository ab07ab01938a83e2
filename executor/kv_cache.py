"""The paged KV cache: per layer, K and V of shape [num_blocks, block_size, kv_heads, head_dim];
the host swap pool is laid out alike."""

from __future__ import annotations

import torch

from folio.executor.model_config import ModelConfig


KVCaches = list[tuple[torch.Tensor, torch.Tensor]]


def bytes_per_block(config: ModelConfig, block_size: int, dtype: torch.dtype) -> int:
    return config.kv_block_bytes(block_size, torch.empty((), dtype=dtype).element_size())


def allocate_kv_cache(config: ModelConfig, num_blocks: int, block_size: int,
                      dtype: torch.dtype, device: torch.device) -> KVCaches:
    # torch.empty: pages are committed only when written, so a large CPU pool costs
    # memory in proportion to the tokens actually cached.
    return _allocate(config, num_blocks, block_size, dtype, device=device)


def allocate_swap_pool(config: ModelConfig, num_blocks: int, block_size: int,
                       dtype: torch.dtype, device: torch.device) -> KVCaches:
    """The host pool that `device`'s blocks are swapped out to, laid out as the KV cache."""
    pin = device.type == "cuda"   # pinned host memory makes non-blocking copies possible
    return _allocate(config, num_blocks, block_size, dtype, pin_memory=pin)


def _allocate(config: ModelConfig, num_blocks: int, block_size: int, dtype: torch.dtype,
              **where) -> KVCaches:
    shape = (num_blocks, block_size, config.num_kv_heads, config.head_dim)
    return [(torch.empty(shape, dtype=dtype, **where), torch.empty(shape, dtype=dtype, **where))
            for _ in range(config.num_layers)]
