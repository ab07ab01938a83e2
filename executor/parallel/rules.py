"""Tensor parallelism's arithmetic, without torch (the command line checks it before any
process starts): which heads, KV heads and MLP columns each rank holds.

Megatron's layout: qkv and gate/up are split by output rows (column-parallel), o and down by
input columns (row-parallel, one all-reduce each), embedding and lm_head by vocabulary rows.
Where the model has fewer KV heads than ranks, each KV head is replicated on the ranks whose
query heads read it (as vLLM does), so every rank still holds at least one.
"""

from __future__ import annotations

from dataclasses import replace

from folio.executor.model_config import ModelConfig


def check_shardable(config: ModelConfig, size: int) -> None:
    """ValueError naming what does not divide, when `config` cannot be split `size` ways."""
    if size == 1:
        return
    problems = []
    if config.moe is not None:
        problems.append("experts (mixture-of-experts layers are not split yet)")
    if config.num_heads % size:
        problems.append(f"{config.num_heads} attention heads")
    kv = config.num_kv_heads
    if kv % size and size % kv:
        problems.append(f"{kv} KV heads (neither a multiple nor a divisor of {size})")
    if config.intermediate_size % size:
        problems.append(f"an MLP of {config.intermediate_size}")
    if problems:
        raise ValueError(f"tensor_parallel_size {size} cannot split {config.architecture}'s "
                         + ", ".join(problems))


def shard_config(config: ModelConfig, size: int) -> ModelConfig:
    """The model one rank builds: its share of the heads and the MLP (vocabulary and hidden
    size stay whole: the vocab-parallel layers pad and split them themselves)."""
    check_shardable(config, size)
    if size == 1:
        return config
    return replace(config, num_heads=config.num_heads // size,
                   num_kv_heads=max(1, config.num_kv_heads // size),
                   intermediate_size=config.intermediate_size // size)


def kv_heads_of(rank: int, size: int, num_kv_heads: int) -> range:
    """The KV heads `rank` holds: its share, or the one its query heads read."""
    if num_kv_heads >= size:
        share = num_kv_heads // size
        return range(rank * share, (rank + 1) * share)
    head = rank * num_kv_heads // size
    return range(head, head + 1)


def vocab_rows(rank: int, size: int, vocab_size: int) -> tuple[int, int, int]:
    """(first row, rows holding real tokens, padded rows per rank) of the vocabulary."""
    per_rank = -(-vocab_size // size)
    start = rank * per_rank
    return start, max(0, min(per_rank, vocab_size - start)), per_rank
