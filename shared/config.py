"""Immutable configuration, passed explicitly to every part that needs it.

SchedulingPolicy is what a user sets for the scheduler; EngineConfig adds what the executor
needs (a user's whole engine). SchedulerConfig is the policy plus the executor's capacity
(number of KV blocks, context limit, EOS ids), known once the executor has said hello.
Each default, help sentence and check is written here once (shared/settings.py's
`setting`): the command line, the FOLIO_* variables and docs/configuration.md are generated
from these fields (folio/flags.py). The settings of the processes around the engine
(transport, shutdown, HTTP) are in shared/service_settings.py.
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields
from typing import Any

from folio.shared.kv_cache_dtype import KV_CACHE_DTYPES
from folio.shared.pooling.task import (POOLING_TYPES, RUNNERS, SCORE_TOKENS_HELP,
                                       parse_score_tokens)
from folio.shared.settings import (SettingError, at_least, check_fields, fraction,
                                   in_range, non_negative_int, optional, positive_int,
                                   power_of_two, above, setting)
from folio.shared.spec_decode_config import (SpeculativeConfig, check_speculative_config,
                                      parse_speculative_config)

__all__ = ["SettingError", "setting", "SchedulingPolicy", "EngineConfig", "ExecutorCapacity",
           "SchedulerConfig", "policy_values"]

DTYPES = ("auto", "float32", "float16", "bfloat16")
DEVICES = ("auto", "cpu", "cuda")
ATTENTION_BACKENDS = ("auto", "torch", "cpu", "triton")
LINEAR_BACKENDS = ("auto", "onednn", "torch")
QUANTIZATIONS = ("none", "int8", "int4")
QUANTIZED_ACTIVATIONS = ("int8", "float")
DECODE_STEPS = ("auto", "python")   # executor/native_step/select.py's
SCHEDULING_POLICIES = ("fcfs", "priority")
PREEMPTION_MODES = ("recompute", "swap", "auto")
SHUTDOWN_TIMEOUT_S = 30.0   # frontend and scheduler: how long a SIGTERM drain may take
SHUTDOWN_HELP = "on SIGTERM, seconds running requests may take to finish before they are aborted"
MAX_REQUESTS_PER_CLIENT = 4096   # frontend: one SDK client's requests in flight
MAX_REQUESTS_PER_CLIENT_HELP = ("requests one SDK client may have in flight over all its "
                                "connections (a client: its peer, the host over tcp://, the "
                                "process over ipc://); more are refused as queue_full")
CURVE_KEYS_HELP = ("CURVE keys directory (`folio keys`): every ZeroMQ socket encrypts and "
                   "refuses peers without the keys (default: no CURVE)")


def _score_tokens_problem(value: Any) -> str | None:
    try:
        parse_score_tokens(value)
    except ValueError as error:
        return str(error)
    return None


def _lora_modules_problem(value: Any) -> str | None:
    names = []
    for item in value or ():
        name, sep, path = str(item).partition("=")
        if not sep or not name or not path:
            return f"takes NAME=PATH items, got {item!r}"
        names.append(name)
    repeated = sorted({n for n in names if names.count(n) > 1})
    return f"names {repeated[0]!r} twice" if repeated else None


MAX_SCHEDULER_STEPS = 32   # a burst's extra tokens are reserved ahead, like drafts


@dataclass(frozen=True, kw_only=True)
class SchedulingPolicy:
    max_num_seqs: int = setting(256, "requests running at once", check=positive_int)
    max_num_batched_tokens: int = setting(
        2048, "tokens computed per step, over all requests", check=positive_int)
    enable_chunked_prefill: bool = setting(
        True, "split long prompts across steps (off: max-num-batched-tokens must hold a "
        "whole max-model-len prompt)")
    enable_prefix_caching: bool = setting(True, "reuse KV blocks of identical prompt prefixes")
    hybrid_checkpoint_blocks: int = setting(
        4, "hybrid models (recurrent state): checkpoint a sequence's state for the prefix "
        "cache every this many KV blocks (0: no prefix cache for hybrids; docs/hybrid.md)",
        check=non_negative_int)
    preemption_mode: str = setting(
        "recompute", "how a request is preempted when KV blocks run out: recompute its "
        "tokens later, swap its blocks to CPU, or auto (the cheaper of the two)",
        choices=PREEMPTION_MODES)
    max_logprobs: int = setting(20, "the largest logprobs / prompt_logprobs a request may ask",
                                check=non_negative_int)
    max_n: int = setting(64, "the largest n (samples per prompt) a request may ask",
                         check=positive_int)
    scheduling_policy: str = setting(
        "fcfs", "fcfs: first come, first served; priority: by each request's priority "
        "(lower first, as vLLM), then arrival, a more urgent arrival preempting less urgent "
        "running requests", choices=SCHEDULING_POLICIES)
    priority_aging_steps: int = setting(
        100, "under --scheduling-policy priority, a waiting request's priority improves by "
        "one for every this many scheduler steps it waits, so a steady stream of urgent "
        "requests cannot hold it back for ever (0: no aging)", metavar="STEPS",
        check=non_negative_int)
    speculative_config: str | None = setting(
        None, "speculative decoding as a JSON object, e.g. '{\"method\": \"ngram\", "
        "\"num_speculative_tokens\": 4}' (methods: ngram, suffix; docs/spec_decode.md); off "
        "when unset",
        check=check_speculative_config, metavar="JSON")
    num_scheduler_steps: int = setting(
        1, "decode passes per scheduler step while at most 8 requests run (multi-step "
        "decoding, docs/multi_step.md): the scheduler and frontend wake once per this many "
        "tokens of a small batch, whose tokens then stream this many at a time; 1: a pass "
        "per step. Speculative decoding, when set, takes its place",
        check=lambda value: positive_int(value) or in_range(1, MAX_SCHEDULER_STEPS)(value),
        metavar="K")
    max_loras: int = setting(
        1, "LoRA adapters the requests of one step may use at once (a request for another "
        "waits until one running adapter's requests are done); the executor keeps that many "
        "on the device", check=positive_int)

    @property
    def speculative(self) -> SpeculativeConfig | None:
        """speculative_config parsed (checked when the config was made); None: off."""
        return parse_speculative_config(self.speculative_config)

    def __post_init__(self) -> None:
        check_fields(self)   # every declared check, the subclasses' fields' too


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
                         "on GPU (float32 ones as bfloat16); on CPU bfloat16 for half-precision "
                         "checkpoints where the CPU multiplies bfloat16 natively (AVX-512 BF16, "
                         "AMX), else float32", choices=DTYPES)
    device: str = setting("auto", "where the executor computes; auto: CUDA when available",
                          choices=DEVICES)
    block_size: int = setting(16, "tokens per KV block (a power of two)", check=power_of_two)
    num_kv_blocks: int | None = setting(None, "KV blocks in the pool (default: sized from "
                                        "cpu-kv-cache-gib or gpu-memory-utilization)",
                                        check=optional(positive_int))
    cpu_kv_cache_gib: float = setting(1.0, "KV pool size on CPU in GiB, when num-kv-blocks "
                                      "is not given", check=above(0))
    gpu_memory_utilization: float = setting(0.9, "share of GPU memory for weights and the "
                                            "KV pool, when num-kv-blocks is not given",
                                            check=fraction)
    max_model_len: int | None = setting(None, "context limit in tokens (default: the "
                                        "model's max_position_embeddings)",
                                        check=optional(positive_int))
    kv_cache_dtype: str = setting(
        "auto", "KV cache element type; auto: the model's dtype. int8: each (token, KV head) "
        "row as int8 with a float16 scale (1.94x the tokens per GiB of bfloat16 at head_dim "
        "64); fp8_*: float8 (2x). The C++ CPU attention and the Triton kernels read them in "
        "place; bfloat16 on Triton only as the model's own dtype (docs/cpu.md)",
        choices=KV_CACHE_DTYPES)
    swap_space: float = setting(1.0, "GiB of CPU swap pool, when preemption may swap",
                                check=at_least(0, " GiB"))
    num_swap_blocks: int | None = setting(None, "CPU swap blocks (default: from swap-space)",
                                          check=optional(non_negative_int))
    attention_backend: str = setting("auto", "attention kernels; auto: triton on CUDA, cpu "
                                     "when its C++ operator is built, else torch",
                                     choices=ATTENTION_BACKENDS)
    linear_backend: str = setting("auto", "CPU matmuls: onednn (prepacked weights), torch "
                                  "(plain F.linear); auto: onednn where torch has it",
                                  choices=LINEAR_BACKENDS)
    quantization: str = setting("none", "linear layers' weights quantized at load (CPU "
                                "only; activations stay float): int8 with one scale per "
                                "output channel, int4 with a scale and a min per 32 input "
                                "values (asymmetric); a GGUF file's Q8_0/Q4_0/Q4_1/Q4_K "
                                "weights and a pre-quantized (compressed-tensors, AWQ, "
                                "GPTQ) checkpoint's are kept as they are whatever this says",
                                choices=QUANTIZATIONS)
    quantized_activations: str = setting(
        "int8", "how int8/int4 weights (--quantization, a GGUF's Q8_0/Q4_x, a pre-quantized "
        "checkpoint's) multiply batches "
        "of up to 8 rows, decode steps: int8 rounds each 32 activations to int8 with a scale "
        "and sums integer dot products (llama.cpp's Q8_0 scheme; about 2x faster on AVX2); "
        "float keeps them float32 (docs/benchmarks.md, quality)",
        choices=QUANTIZED_ACTIVATIONS)
    decode_step: str = setting(
        "auto", "how steps of up to 16 tokens (decodes) run the transformer layers on the "
        "CPU: auto in one C++ call per step where the model allows it (llama-style layers, "
        "and the dense Qwen3.5 / LFM2 hybrids' decode-only steps; float32 or bfloat16, one "
        "rank, no LoRA; the start-up log says), python module by module, as larger steps "
        "always do", choices=DECODE_STEPS)
    cpu_threads: int | None = setting(None, "executor's torch threads on CPU (default: "
                                      "one per core it may use, fewer while other busy "
                                      "processes hold those cores)",
                                      check=optional(positive_int))
    seed: int = setting(0, "seed of requests that do not set their own")
    tensor_parallel_size: int = setting(
        1, "executor ranks the model is split across (one per GPU; on CPU, processes "
        "sharing its cores)", check=positive_int)
    # Multi-node tensor parallelism (vLLM's and SGLang's names): node r runs ranks
    # r*N/nnodes .. (r+1)*N/nnodes-1; node 0 holds rank 0, the one the scheduler talks to.
    nnodes: int = setting(1, "machines the tensor-parallel ranks are spread over (an equal "
                          "share each; every node gives the same engine settings)",
                          check=positive_int)
    node_rank: int = setting(0, "this machine's index among the nnodes (0: the node with "
                             "the scheduler; the others run `folio serve --headless`)",
                             check=non_negative_int)
    master_addr: str | None = setting(None, "node 0's address the other nodes reach (the "
                                      "torch.distributed rendezvous and the plan hop); "
                                      "required with nnodes > 1")
    master_port: int = setting(29500, "node 0's torch.distributed rendezvous port; the plan "
                               "hop to the other nodes listens on master-port + 1",
                               check=in_range(1, 65534))
    # LoRA adapters (docs/lora.md), named as vLLM names them.
    enable_lora: bool = setting(False, "serve LoRA adapters: requests name one (the OpenAI "
                                "model field, or lora=) to run with it")
    lora_modules: tuple[str, ...] = setting(
        (), "LoRA adapters loaded at start, each NAME=PATH (a PEFT adapter directory); "
        "needs --enable-lora", metavar="NAME=PATH", nargs="+", check=_lora_modules_problem)
    max_lora_rank: int = setting(16, "the largest rank of an adapter's modules",
                                 check=positive_int)
    # Pooling models (shared/pooling/task.py, docs/serving.md).
    runner: str = setting(
        "auto", "generate (completions, chat) or pooling (embeddings, rerank, score); auto: "
        "pooling when the checkpoint declares an embedding model (a base-model architecture "
        "such as Qwen3Model, or sentence-transformers' modules.json) or a scorer "
        "(config.json's classifier_from_token), else generate", choices=RUNNERS)
    pooling_type: str = setting(
        "auto", "how the pooling runner pools the prompt's hidden states: last (token) or "
        "mean; auto: what sentence-transformers' 1_Pooling/config.json says, else last",
        choices=POOLING_TYPES)
    score_tokens: str | None = setting(
        None, "serve a decoder reranker (rerank, score) from the next-token logits of "
        f"{SCORE_TOKENS_HELP} (Qwen3-Reranker); default: config.json's "
        "classifier_from_token", check=_score_tokens_problem, metavar="AGAINST,FOR")
    max_cpu_loras: int | None = setting(
        None, "adapters held in host memory; more may be loaded, kept on disk and read "
        "in again by use, the least recently used dropped first (default: max-loras, or "
        "the number of --lora-modules if more)", check=optional(positive_int))

    def __post_init__(self) -> None:
        if not isinstance(self.model, str) or not self.model:
            raise SettingError("model", "must be a path to a checkpoint directory")
        object.__setattr__(self, "lora_modules", tuple(self.lora_modules or ()))
        super().__post_init__()

    @property
    def lora_paths(self) -> dict[str, str]:
        """lora_modules as {name: path} (checked when the config was made)."""
        return dict(item.split("=", 1) for item in self.lora_modules)

    @property
    def lora_capacity(self) -> int:
        """Adapters host memory holds: max_cpu_loras, or enough for the start-time ones."""
        if self.max_cpu_loras is not None:
            return self.max_cpu_loras
        return max(self.max_loras, len(self.lora_modules))

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
    # The LoRA adapters loaded when the executor said hello, by name (docs/lora.md).
    loras: tuple[str, ...] = ()
    # The weights' bytes one decode step reads (executor/weight_bytes.py): with each decode
    # step's time, the step's effective bandwidth (folio:decode_weight_read_gbps).
    weight_bytes_per_step: int = 0
    # The pooling runner's task (shared/pooling/task.py PoolingTask.to_wire); None: generate.
    pooling: dict[str, Any] | None = None
    # A hybrid model's recurrent state (executor/models/hybrid/): one slot per request that
    # holds one, and the bytes of one; 0 slots: every layer is attention.
    num_state_slots: int = 0
    state_bytes: int = 0
    # Host slots a swapped-out request's state waits in (0: hybrids recompute).
    num_swap_state_slots: int = 0


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
    loras: tuple[str, ...] = ()           # as ExecutorCapacity.loras
    num_state_slots: int = 0              # as ExecutorCapacity.num_state_slots
    state_bytes: int = 0
    num_swap_state_slots: int = 0

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
        if capacity.num_state_slots and not policy["hybrid_checkpoint_blocks"]:
            # A recurrent state cannot resume from shared blocks alone (docs/hybrid.md).
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
            loras=capacity.loras,
            num_state_slots=capacity.num_state_slots,
            state_bytes=capacity.state_bytes,
            num_swap_state_slots=capacity.num_swap_state_slots,
        )


def _positive(name: str, value: Any) -> None:
    problem = positive_int(value)
    if problem is not None:
        raise SettingError(name, problem)
