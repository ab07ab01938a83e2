"""Immutable configuration, passed explicitly to every part that needs it.

EngineConfig is what a user sets. SchedulerConfig is what the scheduler needs, derived once
the executor has reported its capacity (number of KV blocks, context limit, EOS ids).
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any

DTYPES = ("auto", "float32", "float16", "bfloat16")
DEVICES = ("auto", "cpu", "cuda")
ATTENTION_BACKENDS = ("auto", "torch", "cpu", "triton")
LINEAR_BACKENDS = ("auto", "onednn", "torch")
PREEMPTION_MODES = ("recompute", "swap", "auto")


@dataclass(frozen=True)
class EngineConfig:
    model: str
    tokenizer: str | None = None
    skip_tokenizer_init: bool = False      # token ids in and out, no text
    dtype: str = "auto"
    device: str = "auto"
    block_size: int = 16
    num_kv_blocks: int | None = None       # None: size the pool from memory
    cpu_kv_cache_gib: float = 1.0          # KV pool size on CPU when num_kv_blocks is None
    gpu_memory_utilization: float = 0.9    # fraction of GPU memory for weights + KV
    max_num_seqs: int = 256
    max_num_batched_tokens: int = 2048
    max_model_len: int | None = None       # None: the checkpoint's max_position_embeddings
    enable_chunked_prefill: bool = True
    enable_prefix_caching: bool = True
    preemption_mode: str = "recompute"     # recompute, swap, or auto (cheaper of the two)
    swap_space: float = 1.0                # GiB of CPU swap pool (when preemption may swap)
    num_swap_blocks: int | None = None     # overrides swap_space
    attention_backend: str = "auto"
    linear_backend: str = "auto"           # CPU matmuls: oneDNN prepacked, or plain F.linear
    cpu_threads: int | None = None         # executor's torch threads on CPU (None: measured)
    seed: int = 0
    max_logprobs: int = 20                 # the largest logprobs / prompt_logprobs accepted
    max_n: int = 64                        # the largest n accepted

    def __post_init__(self) -> None:
        if not isinstance(self.model, str) or not self.model:
            raise ValueError("model must be a path to a checkpoint directory")
        _choice("dtype", self.dtype, DTYPES)
        _choice("device", self.device, DEVICES)
        _choice("attention_backend", self.attention_backend, ATTENTION_BACKENDS)
        _choice("linear_backend", self.linear_backend, LINEAR_BACKENDS)
        if self.cpu_threads is not None:
            _positive("cpu_threads", self.cpu_threads)
        _choice("preemption_mode", self.preemption_mode, PREEMPTION_MODES)
        if self.num_swap_blocks is not None and self.num_swap_blocks < 0:
            raise ValueError(f"num_swap_blocks must be >= 0, got {self.num_swap_blocks}")
        if self.swap_space < 0:
            raise ValueError(f"swap_space must be >= 0 GiB, got {self.swap_space}")
        _positive("block_size", self.block_size)
        if self.block_size & (self.block_size - 1):
            raise ValueError(f"block_size must be a power of two, got {self.block_size}")
        if self.num_kv_blocks is not None:
            _positive("num_kv_blocks", self.num_kv_blocks)
        _positive("max_num_seqs", self.max_num_seqs)
        _positive("max_n", self.max_n)
        if self.max_logprobs < 0:
            raise ValueError(f"max_logprobs must be >= 0, got {self.max_logprobs}")
        _positive("max_num_batched_tokens", self.max_num_batched_tokens)
        if self.max_model_len is not None:
            _positive("max_model_len", self.max_model_len)
        if not 0 < self.cpu_kv_cache_gib:
            raise ValueError(f"cpu_kv_cache_gib must be > 0, got {self.cpu_kv_cache_gib}")
        if not 0 < self.gpu_memory_utilization <= 1:
            raise ValueError(
                f"gpu_memory_utilization must be in (0, 1], got {self.gpu_memory_utilization}")

    @property
    def tokenizer_path(self) -> str:
        return self.tokenizer or self.model

    def with_overrides(self, **changes: Any) -> "EngineConfig":
        return replace(self, **changes)


@dataclass(frozen=True)
class ExecutorCapacity:
    """What the executor reports at start-up: the scheduler plans within these limits."""

    num_kv_blocks: int
    block_size: int
    max_model_len: int
    vocab_size: int
    eos_token_ids: tuple[int, ...]
    num_swap_blocks: int = 0
    # Inputs of the swap-or-recompute estimate (preemption_mode="auto").
    bytes_per_block: int = 0
    prefill_tokens_per_s: float = 0.0
    swap_bytes_per_s: float = 0.0


@dataclass(frozen=True)
class SchedulerConfig:
    num_kv_blocks: int
    block_size: int
    max_num_seqs: int
    max_num_batched_tokens: int
    max_model_len: int
    enable_chunked_prefill: bool = True
    eos_token_ids: tuple[int, ...] = field(default_factory=tuple)
    vocab_size: int = 2**31 - 1
    enable_prefix_caching: bool = True
    preemption_mode: str = "recompute"
    num_swap_blocks: int = 0
    bytes_per_block: int = 0
    prefill_tokens_per_s: float = 0.0
    swap_bytes_per_s: float = 0.0
    max_logprobs: int = 20
    max_n: int = 64

    def __post_init__(self) -> None:
        for name in ("num_kv_blocks", "block_size", "max_num_seqs", "max_num_batched_tokens",
                     "max_model_len"):
            _positive(name, getattr(self, name))
        if not self.enable_chunked_prefill and self.max_num_batched_tokens < self.max_model_len:
            raise ValueError(
                "without chunked prefill, max_num_batched_tokens "
                f"({self.max_num_batched_tokens}) must be >= max_model_len ({self.max_model_len})")

    @property
    def max_request_len(self) -> int:
        """Tokens one request may hold: the context limit, or the whole pool if smaller."""
        return min(self.max_model_len, self.num_kv_blocks * self.block_size)

    @classmethod
    def from_engine(cls, engine: EngineConfig, capacity: ExecutorCapacity) -> "SchedulerConfig":
        return cls(
            num_kv_blocks=capacity.num_kv_blocks,
            block_size=capacity.block_size,
            max_num_seqs=engine.max_num_seqs,
            max_num_batched_tokens=engine.max_num_batched_tokens,
            max_model_len=capacity.max_model_len,
            enable_chunked_prefill=engine.enable_chunked_prefill,
            eos_token_ids=capacity.eos_token_ids,
            vocab_size=capacity.vocab_size,
            enable_prefix_caching=engine.enable_prefix_caching,
            preemption_mode=engine.preemption_mode,
            num_swap_blocks=capacity.num_swap_blocks,
            bytes_per_block=capacity.bytes_per_block,
            prefill_tokens_per_s=capacity.prefill_tokens_per_s,
            swap_bytes_per_s=capacity.swap_bytes_per_s,
            max_logprobs=engine.max_logprobs,
            max_n=engine.max_n,
        )


def _choice(name: str, value: Any, allowed: tuple[str, ...]) -> None:
    if value not in allowed:
        raise ValueError(f"{name} must be one of {', '.join(allowed)}; got {value!r}")


def _positive(name: str, value: Any) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"{name} must be a positive integer, got {value!r}")
