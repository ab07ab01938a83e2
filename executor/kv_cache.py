"""The paged KV cache: per layer, K and V of shape [num_blocks, block_size, kv_heads, head_dim]."""

from __future__ import annotations

import torch

from folio.executor.model_config import ModelConfig


def bytes_per_block(config: ModelConfig, block_size: int, dtype: torch.dtype) -> int:
    element = torch.empty((), dtype=dtype).element_size()
    return 2 * config.num_layers * block_size * config.num_kv_heads * config.head_dim * element


def allocate_kv_cache(config: ModelConfig, num_blocks: int, block_size: int,
                      dtype: torch.dtype, device: torch.device
                      ) -> list[tuple[torch.Tensor, torch.Tensor]]:
    # torch.empty: pages are committed only when written, so a large CPU pool costs
    # memory in proportion to the tokens actually cached.
    shape = (num_blocks, block_size, config.num_kv_heads, config.head_dim)
    return [(torch.empty(shape, dtype=dtype, device=device),
             torch.empty(shape, dtype=dtype, device=device)) for _ in range(config.num_layers)]
