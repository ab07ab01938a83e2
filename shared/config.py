"""Immutable configuration, passed explicitly to every part that needs it.

SchedulingPolicy is what a user sets for the scheduler; EngineConfig adds what the executor
needs (a user's whole engine). SchedulerConfig is the policy plus the executor's capacity
(number of KV blocks, context limit, EOS ids), known once the executor has said hello.
Each default and each flag's help sentence is written here once: the command line is
generated from these fields (folio/cli.py).
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields
from typing import Any

DTYPES = ("auto", "float32", "float16", "bfloat16")
DEVICES = ("auto", "cpu", "cuda")
ATTENTION_BACKENDS = ("auto", "torch", "cpu", "triton")
LINEAR_BACKENDS = ("auto", "onednn", "torch")
PREEMPTION_MODES = ("recompute", "swap", "auto")
SHUTDOWN_TIMEOUT_S = 30.0   # frontend and scheduler: how long a SIGTERM drain may take
SHUTDOWN_HELP = "on SIGTERM, seconds running requests may take to finish before they are aborted"
MAX_REQUESTS_PER_CLIENT = 4096   # frontend: one SDK connection's requests in flight
MAX_REQUESTS_PER_CLIENT_HELP = ("requests one SDK client (one ZeroMQ connection) may have in "
                                "flight; more are refused as queue_full (default: 4096)")
CURVE_KEYS_HELP = ("CURVE keys directory (`folio keys`): every ZeroMQ socket encrypts and "
                   "refuses peers without the keys (default: no CURVE)")


class SettingError(ValueError):
    """A setting no engine can run with; `setting` is the field's name (the flag's too)."""

    def __init__(self, setting: str, problem: str) -> None:
        super().__init__(f"{setting} {problem}")
        self.setting = setting
        self.problem = problem


def setting(default: Any, help: str, flag: str | None = None) -> Any:
    """A config field with the sentence its --flag's help shows (and its flag name when
    that is not the field's name); default MISSING makes a required field."""
    metadata = {"help": help, **({"flag": flag} if flag else {})}
    return field(default=default, metadata=metadata)


@dataclass(frozen=True, kw_only=True)
class SchedulingPolicy:
    max_num_seqs: int = setting(256, "requests running at once")
    max_num_batched_tokens: int = setting(2048, "tokens computed per step, over all requests")
    enable_chunked_prefill: bool = setting(
        True, "split long prompts across steps (off: max-num-batched-tokens must hold a "
        "whole max-model-len prompt)")
    enable_prefix_caching: bool = setting(True, "reuse KV blocks of identical prompt prefixes")
    preemption_mode: str = setting(
        "recompute", "how a request is preempted when KV blocks run out: recompute its "
        "tokens later, swap its blocks to CPU, or auto (the cheaper of the two)")
    max_logprobs: int = setting(20, "the largest logprobs / prompt_logprobs a request may ask")
    max_n: int = setting(64, "the largest n (samples per prompt) a request may ask")

    def __post_init__(self) -> None:
        _positive("max_num_seqs", self.max_num_seqs)
        _positive("max_num_batched_tokens", self.max_num_batched_tokens)
        _choice("preemption_mode", self.preemption_mode, PREEMPTION_MODES)
        _positive("max_n", self.max_n)
        if isinstance(self.max_logprobs, bool) or not isinstance(self.max_logprobs, int) \
                or self.max_logprobs < 0:
            raise SettingError("max_logprobs", f"must be an integer >= 0, got "
                               f"{self.max_logprobs!r}")


def policy_values(config: SchedulingPolicy) -> dict[str, Any]:
    """The SchedulingPolicy fields of any config that extends it."""
    return {f.name: getattr(config, f.name) for f in fields(SchedulingPolicy)}


@dataclass(frozen=True)
class EngineConfig(SchedulingPolicy):
    model: str
    tokenizer: str | None = setting(None, "tokenizer directory (default: the model "
                                    "directory)")
    skip_tokenizer_init: bool = setting(False, "token ids in and out, no tokenizer loaded")
    dtype: str = setting("auto", "weights' and activations' type; auto: the checkpoint's "
                         "on GPU (float32 ones as bfloat16), float32 on CPU")
    device: str = setting("auto", "where the executor computes; auto: CUDA when available")
    block_size: int = setting(16, "tokens per KV block (a power of two)")
    num_kv_blocks: int | None = setting(None, "KV blocks in the pool (default: sized from "
                                        "cpu-kv-cache-gib or gpu-memory-utilization)")
    cpu_kv_cache_gib: float = setting(1.0, "KV pool size on CPU in GiB, when num-kv-blocks "
                                      "is not given")
    gpu_memory_utilization: float = setting(0.9, "share of GPU memory for weights and the "
                                            "KV pool, when num-kv-blocks is not given")
    max_model_len: int | None = setting(None, "context limit in tokens (default: the "
                                        "model's max_position_embeddings)")
    swap_space: float = setting(1.0, "GiB of CPU swap pool, when preemption may swap")
    num_swap_blocks: int | None = setting(None, "CPU swap blocks (default: from swap-space)")
    attention_backend: str = setting("auto", "attention kernels; auto: triton on CUDA, cpu "
                                     "when its C++ operator is built, else torch")
    linear_backend: str = setting("auto", "CPU matmuls: onednn (prepacked weights), torch "
                                  "(plain F.linear); auto: onednn where torch has it")
    cpu_threads: int | None = setting(None, "executor's torch threads on CPU (default: "
                                      "one per core it may use, fewer while other busy "
                                      "processes hold those cores)")
    seed: int = setting(0, "seed of requests that do not set their own")
    tensor_parallel_size: int = setting(
        1, "executor ranks the model is split across (one per GPU; on CPU, processes "
        "sharing its cores)")

    def __post_init__(self) -> None:
        if not isinstance(self.model, str) or not self.model:
            raise SettingError("model", "must be a path to a checkpoint directory")
        super().__post_init__()
        _choice("dtype", self.dtype, DTYPES)
        _choice("device", self.device, DEVICES)
        _choice("attention_backend", self.attention_backend, ATTENTION_BACKENDS)
        _choice("linear_backend", self.linear_backend, LINEAR_BACKENDS)
        if self.cpu_threads is not None:
            _positive("cpu_threads", self.cpu_threads)
        if self.num_swap_blocks is not None and self.num_swap_blocks < 0:
            raise SettingError("num_swap_blocks", f"must be >= 0, got {self.num_swap_blocks}")
        if self.swap_space < 0:
            raise SettingError("swap_space", f"must be >= 0 GiB, got {self.swap_space}")
        _positive("tensor_parallel_size", self.tensor_parallel_size)
        _positive("block_size", self.block_size)
        if self.block_size & (self.block_size - 1):
            raise SettingError("block_size", f"must be a power of two, got {self.block_size}")
        if self.num_kv_blocks is not None:
            _positive("num_kv_blocks", self.num_kv_blocks)
        if self.max_model_len is not None:
            _positive("max_model_len", self.max_model_len)
        if not 0 < self.cpu_kv_cache_gib:
            raise SettingError("cpu_kv_cache_gib", f"must be > 0, got {self.cpu_kv_cache_gib}")
        if not 0 < self.gpu_memory_utilization <= 1:
            raise SettingError("gpu_memory_utilization",
                               f"must be in (0, 1], got {self.gpu_memory_utilization}")

    @property
    def tokenizer_path(self) -> str:
        return self.tokenizer or self.model


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
    # The largest attention window when EVERY layer is windowed (a query at p reads keys
    # p - W < j <= p), else None: the scheduler may then free blocks that left the window.
    sliding_window: int | None = None
    # The executor may rewrite a sequence's cached KV in place (Phi-3's longrope switch
    # recomputes it with the other factors): no block may then be shared through the prefix
    # cache, or another request would read the rewritten values.
    rewrites_kv: bool = False


@dataclass(frozen=True)
class SchedulerConfig(SchedulingPolicy):
    num_kv_blocks: int
    block_size: int
    max_model_len: int
    eos_token_ids: tuple[int, ...] = field(default_factory=tuple)
    vocab_size: int = 2**31 - 1
    num_swap_blocks: int = 0
    bytes_per_block: int = 0
    prefill_tokens_per_s: float = 0.0
    swap_bytes_per_s: float = 0.0
    sliding_window: int | None = None     # as ExecutorCapacity.sliding_window

    def __post_init__(self) -> None:
        super().__post_init__()
        for name in ("num_kv_blocks", "block_size", "max_model_len"):
            _positive(name, getattr(self, name))
        if self.sliding_window is not None:
            _positive("sliding_window", self.sliding_window)
            if self.num_kv_blocks < 2:
                raise SettingError("num_kv_blocks", "must be >= 2 for a sliding-window model "
                                   "(one block is the null block freed table entries name)")
        if not self.enable_chunked_prefill and self.max_num_batched_tokens < self.max_model_len:
            raise SettingError(
                "max_num_batched_tokens",
                f"({self.max_num_batched_tokens}) must be >= max_model_len "
                f"({self.max_model_len}) without chunked prefill; raise it, lower "
                "max_model_len or enable chunked prefill")

    @property
    def usable_kv_blocks(self) -> int:
        """Blocks requests can hold: a sliding-window model reserves one null block."""
        return self.num_kv_blocks - (self.sliding_window is not None)

    @property
    def window_peak_blocks(self) -> int | None:
        """With every layer windowed, the most blocks one request holds at once: a step's
        new tokens (at most max_num_batched_tokens) and the window before them, plus one
        for a window start inside a block. None without a window."""
        if self.sliding_window is None:
            return None
        size = self.block_size
        return -(-(self.sliding_window - 1 + self.max_num_batched_tokens) // size) + 1

    @property
    def max_request_len(self) -> int:
        """Tokens one request may hold: the context limit, or the whole pool if smaller.
        A sliding-window model whose peak per-request footprint fits the pool is bounded
        by the context limit only: blocks behind the window are freed as it moves."""
        peak = self.window_peak_blocks
        if peak is not None and peak <= self.usable_kv_blocks:
            return self.max_model_len
        return min(self.max_model_len, self.usable_kv_blocks * self.block_size)

    @classmethod
    def from_engine(cls, engine: SchedulingPolicy, capacity: ExecutorCapacity
                    ) -> "SchedulerConfig":
        """The policy of `engine` (an EngineConfig, or any SchedulingPolicy) within the
        executor's capacity."""
        policy = policy_values(engine)
        if capacity.rewrites_kv:
            policy["enable_prefix_caching"] = False
        return cls(
            **policy,
            num_kv_blocks=capacity.num_kv_blocks,
            block_size=capacity.block_size,
            max_model_len=capacity.max_model_len,
            eos_token_ids=capacity.eos_token_ids,
            vocab_size=capacity.vocab_size,
            num_swap_blocks=capacity.num_swap_blocks,
            bytes_per_block=capacity.bytes_per_block,
            prefill_tokens_per_s=capacity.prefill_tokens_per_s,
            swap_bytes_per_s=capacity.swap_bytes_per_s,
            sliding_window=capacity.sliding_window,
        )


def _choice(name: str, value: Any, allowed: tuple[str, ...]) -> None:
    if value not in allowed:
        raise SettingError(name, f"must be one of {', '.join(allowed)}; got {value!r}")


def _positive(name: str, value: Any) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise SettingError(name, f"must be a positive integer, got {value!r}")
