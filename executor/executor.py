"""Applies step plans: keeps the persistent batch, runs the forward pass, samples."""

from __future__ import annotations

import logging
import time

import torch

from folio.executor.block_mover import BlockMover, measure_swap_bytes_per_s
from folio.executor.structured_output import GrammarMasks
from folio.executor.input_batch import InputBatch
from folio.executor.cpu_threads import apply_cpu_threads
from folio.executor.kv_cache import allocate_kv_cache, allocate_swap_pool, bytes_per_block
from folio.kernels.kv_quant import kv_storage_dtype
from folio.executor.linear import float_linear
from folio.executor.model_config import ModelConfig
from folio.executor.model_loader import load_model
from folio.executor.multi_step.burst import run_burst
from folio.executor.quantization.weight_formats import apply_weight_format
from folio.executor.quantization.weight_only_linear import WeightOnlyLinear
from folio.executor.weight_bytes import weight_bytes_per_step
from folio.kernels import cpu_attention, cpu_recurrent
from folio.executor.models.architectures import ARCHITECTURES
from folio.executor.models.hybrid.executor_checks import (refuse_unsupported, state_banner,
                                                          tokens_per_gib)
from folio.executor.models.hybrid.state_pool import StatePool
from folio.executor.models.hf_config import read_model_config
from folio.executor.models.longrope import recompute_crossing
from folio.executor.native_step import select_decode_step
from folio.executor.pooling.pooler import Pooler
from folio.executor.ops import select_ops
from folio.executor.sampler import Sampler, score_tokens
from folio.executor.spec_decode.speculator import new_speculator
from folio.executor.thread_governor import ThreadGovernor
from folio.shared.config import EngineConfig, ExecutorCapacity
from folio.shared.pooling.task import resolve_pooling_task
from folio.shared.protocol.step import StepPlan, StepResult

log = logging.getLogger("folio.executor")

_DTYPES = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16}


def kv_window(model_config: ModelConfig, max_model_len: int) -> int | None:
    """The window the scheduler may free blocks behind: the largest layer window, when every
    layer has one shorter than the context served (a longer one excludes nothing, and the
    layer runs as full attention); None when any layer reads the whole context."""
    windows = model_config.layer_windows
    if not windows or any(w is None or w >= max_model_len for w in windows):
        return None
    return max(windows)


def resolve_device(name: str) -> torch.device:
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if name == "cuda" and not torch.cuda.is_available():
        raise ValueError("device='cuda' was asked for but no CUDA device is available")
    return torch.device(name)


def resolve_dtype(name: str, checkpoint_dtype: str, device: torch.device) -> torch.dtype:
    if name != "auto":
        return _DTYPES[name]
    if device.type == "cpu":
        # Real checkpoints ship bfloat16. Where the CPU multiplies bfloat16 natively (AVX-512
        # BF16, AMX) serve them so, as vLLM's CPU build does: 1.3-1.4x float32's tokens/s
        # (docs/benchmarks.md). Elsewhere half precision is emulated, slower than float32.
        # float16 checkpoints take bfloat16 too: CPUs have no fast float16 matmul.
        if checkpoint_dtype in ("float16", "bfloat16") and cpu_multiplies_bfloat16():
            return torch.bfloat16
        return torch.float32
    # On GPUs serve half precision: the checkpoint's own, or bfloat16 for float32 ones.
    return _DTYPES[checkpoint_dtype] if checkpoint_dtype in ("float16", "bfloat16") \
        else torch.bfloat16


def _by_handle(checkpoints: list[tuple[int, int, int]]) -> dict[int, list[tuple[int, int]]]:
    grouped: dict[int, list[tuple[int, int]]] = {}
    for handle, tokens, slot in checkpoints:
        grouped.setdefault(handle, []).append((tokens, slot))
    return grouped


def cpu_multiplies_bfloat16() -> bool:
    return torch.cpu._is_avx512_bf16_supported() or torch.cpu._is_amx_tile_supported()


class Executor:
    def __init__(self, config: EngineConfig, tp=None) -> None:
        """`tp`: this process's rank of a tensor-parallel group (executor/parallel/sharding.py); it
        builds and caches its share of the model, and every count of blocks is the
        smallest rank's."""
        if config.tensor_parallel_size > 1 and tp is None:
            raise ValueError("tensor_parallel_size > 1 needs this process's rank: folio.LLM, "
                             "`folio executor` and `folio serve` start the group")
        self.config = config
        self.tp = tp
        self.model_config = read_model_config(config.model)
        if tp is not None:
            self.model_config = tp.shard_config(self.model_config)
        self.device = resolve_device(config.device)
        self.dtype = resolve_dtype(config.dtype, self.model_config.torch_dtype, self.device)
        self.max_model_len = self._max_model_len()
        self.cpu_threads = apply_cpu_threads(config.cpu_threads) if self.device.type == "cpu" \
            else None
        # A thread count nobody fixed follows the cores the machine gives (thread_governor).
        self.threads = (ThreadGovernor(self.cpu_threads, torch.set_num_threads)
                        if self.cpu_threads and config.cpu_threads is None and tp is None
                        else None)
        self.ops = select_ops(config.attention_backend, self.device)
        # The pooling runner's task (None: generate); an embedder needs no LM head.
        self.pooling_task = resolve_pooling_task(config.model, config.runner,
                                                 config.pooling_type, config.score_tokens)
        hybrid = self.model_config.hybrid
        if hybrid is not None:
            refuse_unsupported(config, self.model_config, tp is not None)
        if self.model_config.gemma4 is not None:
            from folio.executor.models.gemma4.executor_checks import refuse_unsupported \
                as refuse_for_gemma4

            refuse_for_gemma4(config, self.model_config, tp is not None)
        self.model = load_model(config.model, self.model_config, self.ops, self.dtype,
                                self.device, self.max_model_len, tp,
                                needs_lm_head=self.pooling_task is None
                                or self.pooling_task.scores)
        weights = apply_weight_format(self.model, config, self.model_config, self.device,
                                      self.dtype, tp)
        self.num_params = weights.num_params
        self.linear_backend = weights.linear_backend
        self.weight_bytes_per_step = weight_bytes_per_step(self.model)   # before any adapter
        self.lora = self._new_lora_registry()
        self.model.native_step = select_decode_step(   # after the registry: model.lora_step
            self.model, config.decode_step, self.ops, self.device, self.dtype, tp is not None)
        # A hybrid's recurrent states: one slot per request that may run at once, and as
        # many again for the prefix cache's checkpoints (docs/hybrid.md).
        checkpoints = config.enable_prefix_caching and config.hybrid_checkpoint_blocks > 0
        self.num_state_slots = (config.max_num_seqs * (2 if checkpoints else 1)
                                if hybrid is not None else 0)
        self.state_bytes = self.model_config.state_bytes(self.dtype.itemsize)
        self.kv_dtype = kv_storage_dtype(config.kv_cache_dtype, self.dtype)
        if (self.ops.name == "triton" and self.kv_dtype.is_floating_point
                and self.kv_dtype.itemsize > 1 and self.kv_dtype != self.dtype):
            raise ValueError(f"kv_cache_dtype={config.kv_cache_dtype}: the Triton attention "
                             "kernels read float caches in the model's dtype only (int8 and "
                             "fp8_* caches they read in place)")
        odd = [dim for _, dim in self.model_config.kv_cache_shapes if dim % 2]
        if self.ops.name == "triton" and self.kv_dtype == torch.int8 and odd:
            raise ValueError(f"kv_cache_dtype=int8: the Triton kernels need an even head_dim "
                             f"(this model's is {odd[0]})")
        self.bytes_per_block = bytes_per_block(self.model_config, config.block_size,
                                               self.kv_dtype)
        self.num_kv_blocks = self._num_kv_blocks()
        if tp is not None:
            self.num_kv_blocks = tp.agree(self.num_kv_blocks)
        self.states = None if hybrid is None else StatePool(
            hybrid, self.num_state_slots, self.dtype, self.device)
        if self.states is not None:
            self.model.attach_states(self.states)
            log.info(cpu_recurrent.describe(self.device, self.ops.name))
        self.kv_caches = allocate_kv_cache(self.model_config, self.num_kv_blocks,
                                           config.block_size, self.kv_dtype, self.device)
        # A hybrid's swapped-out states wait in host slots, one per request that may run.
        self.num_swap_state_slots = (config.max_num_seqs if hybrid is not None
                                     and config.preemption_mode != "recompute" else 0)
        self.num_swap_blocks = self._num_swap_blocks()
        if tp is not None:
            self.num_swap_blocks = tp.agree(self.num_swap_blocks)
        self.swap_caches = allocate_swap_pool(self.model_config, self.num_swap_blocks,
                                              config.block_size, self.kv_dtype, self.device)
        swap_states = None if not self.num_swap_state_slots else StatePool(
            hybrid, self.num_swap_state_slots, self.dtype, torch.device("cpu"))
        self.mover = BlockMover(self.kv_caches, self.swap_caches,
                                self.states.tensors() if swap_states else (),
                                swap_states.tensors() if swap_states else ())
        self.cost_model = self._measure_costs() if config.preemption_mode == "auto" else (0, 0)
        self.batch = self._new_batch()
        self.pooler = Pooler(self.pooling_task)
        self.sampler = Sampler(self.device, config.seed, self.model_config.eos_token_ids)
        self.grammar = self._new_grammar()
        original = getattr(self.model, "longrope_original", None)
        self._rewrites_kv = original is not None and self.max_model_len > original
        # Not when the KV is rewritten in place (longrope): its recompute reads known tokens.
        self.speculator = None if self._rewrites_kv else new_speculator(config,
                                                                         self.max_model_len)
        if self._rewrites_kv and config.enable_prefix_caching:
            log.warning("longrope: a sequence passing %d tokens has its cached part recomputed "
                        "in place, so the scheduler shares no block through the prefix cache "
                        "(docs/models.md)", original)
        log.info("executor ready: %s on %s (%s), %d KV blocks of %d tokens (%s KV, %d tokens "
                 "per GiB%s), %s kernels, %s linear layers%s", self.model_config.architecture,
                 self.device, self.dtype, self.num_kv_blocks, config.block_size,
                 str(self.kv_dtype).removeprefix("torch."),
                 tokens_per_gib(self.bytes_per_block, config.block_size, self.state_bytes,
                                self.max_model_len),
                 state_banner(self.num_state_slots, self.state_bytes, self.max_model_len),
                 self.ops.name,
                 self.linear_backend,
                 f", {self.cpu_threads} CPU threads" if self.cpu_threads else "")

    @property
    def capacity(self) -> ExecutorCapacity:
        return ExecutorCapacity(
            num_kv_blocks=self.num_kv_blocks,
            block_size=self.config.block_size,
            max_model_len=self.max_model_len,
            vocab_size=self.model_config.vocab_size,
            eos_token_ids=self.model_config.eos_token_ids,
            num_swap_blocks=self.num_swap_blocks,
            bytes_per_block=self.bytes_per_block,
            prefill_tokens_per_s=self.cost_model[0],
            swap_bytes_per_s=self.cost_model[1],
            sliding_window=kv_window(self.model_config, self.max_model_len),
            rewrites_kv=self._rewrites_kv,
            loras=tuple(self.lora.names_loaded()) if self.lora is not None else (),
            weight_bytes_per_step=self.weight_bytes_per_step,
            pooling=None if self.pooling_task is None else self.pooling_task.to_wire(),
            num_state_slots=self.num_state_slots,
            state_bytes=self.state_bytes,
            num_swap_state_slots=self.num_swap_state_slots,
        )

    def reset(self) -> None:
        """Forget every request (a new scheduler starts from nothing)."""
        self.batch = self._new_batch()
        self.pooler = Pooler(self.pooling_task)
        self.grammar.close()
        self.grammar = self._new_grammar()

    @torch.inference_mode()
    def execute(self, plan: StepPlan) -> StepResult:
        start = time.perf_counter()
        self.grammar.apply(plan)
        if self.speculator is not None:
            for handle in plan.dropped_handles:
                self.speculator.retire(self.batch.requests.get(handle))
        scheduled = self.batch.apply(plan)
        pooler = self.pooler
        if plan.dropped_handles:
            pooler.forget(plan.dropped_handles)
        if plan.new_requests:
            pooler.admit(plan.new_requests, self.batch.requests)
        self.mover.apply(plan.copies, plan.swap_out, plan.swap_in, plan.state_swap_out,
                         plan.state_swap_in)
        if self.states is not None:   # requests resuming from prefix-cache checkpoints
            self.states.copy(plan.state_copies)
        result = StepResult(step_id=plan.step_id)
        computed = sum(count for _, count in scheduled)
        if scheduled:
            self._run(scheduled, plan.drafts, _by_handle(plan.checkpoints), result)
            if plan.drafts and self.speculator is None:   # multi-step: the caps are bursts
                computed += run_burst(self._run, self.batch, self.model_config.eos_token_ids,
                                      plan.drafts, result)
        result.forward_ms = (time.perf_counter() - start) * 1e3
        if self.threads is not None:
            self.threads.after_step(computed, result.forward_ms / 1e3)
        return result

    def _run(self, scheduled: list, caps: dict[int, int],
             checkpoints: dict[int, list[tuple[int, int]]], result: StepResult) -> None:
        """One forward pass over `scheduled` (request, tokens) and its sampling, into
        `result`; `caps`: the plan's draft caps (speculation proposes within them)."""
        drafts = self.speculator.propose(scheduled, caps, self.batch) \
            if caps and self.speculator is not None else None
        # The state slots, and where each sequence starts, before prepare moves them.
        begins = [request.num_computed for request, _ in scheduled] \
            if self.states is not None else None
        inputs = self.batch.prepare(scheduled, drafts)
        # Pooling requests (executor/pooling/): out of sampling, pooled after the pass.
        pooler = self.pooler
        pooling = pooler.split(scheduled, inputs, result)
        if pooling is not None:
            inputs = pooling.inputs
        # Structured outputs' masks, on a worker thread while the forward pass runs.
        pending_masks = self.grammar.start(inputs.sampled, inputs.drafts)
        if getattr(self.model, "longrope_original", None) is not None:
            recompute_crossing(self.model, self.ops, self.model.longrope_original,
                               [request for request, _ in scheduled], self.batch.rows.tokens,
                               inputs.attention, self.kv_caches, self.config.block_size,
                               self.lora)
        attention = self.ops.prepare(inputs.attention, self.config.block_size)
        if self.lora is not None:
            self.lora.begin_step(scheduled)
        try:
            step_states = None if begins is None else self.states.step(
                [request.state_slot for request, _ in scheduled], begins,
                inputs.attention.query_start_loc.tolist(), checkpoints,
                [request.handle for request, _ in scheduled],
                [bool(drafts) and request.handle in drafts for request, _ in scheduled])
            extra = {} if step_states is None else {"states": step_states}
            hidden = self.model(inputs.input_ids, inputs.positions, self.kv_caches,
                                attention, **extra)
        finally:
            if self.lora is not None:
                self.lora.end_step()
        masks = pending_masks.result() if pending_masks is not None else None
        if pooling is not None:
            pooler.finish(pooling, hidden, self.model, result)
        if inputs.sampled and drafts:   # several rows per request (spec_decode/speculator.py)
            logits = self.model.compute_logits(hidden[inputs.logits_indices])
            pairs = self.speculator.finish_step(
                self.sampler, self.batch, inputs, logits, masks,
                self.grammar.take_failed(inputs.sampled), result)
            self.grammar.accepted([r for r, _ in pairs], [t for _, t in pairs])
            if step_states is not None and step_states.held:
                # A hybrid's slots take the state after the tokens kept (hybrid.md).
                self.states.commit(step_states, [
                    request.num_computed - begin for (request, _), begin
                    in zip(scheduled, begins)])
        elif inputs.sampled:
            logits = self.model.compute_logits(hidden[inputs.logits_indices])
            sampled = self.sampler.sample(logits, inputs.sampled, masks)
            tokens, logprobs = sampled.tokens, sampled.logprobs
            for request, token in zip(inputs.sampled, tokens):
                self.batch.append_token(request, token)
            failed = {**self.grammar.take_failed(inputs.sampled), **sampled.failed}
            kept = inputs.sampled
            if failed:   # those requests alone end, with why; their placeholder is kept
                result.failed = [(kept[i].handle, why) for i, why in failed.items()]
                rows = [i for i in range(len(kept)) if i not in failed]
                kept, tokens = [kept[i] for i in rows], [tokens[i] for i in rows]
                logprobs = [logprobs[i] for i in rows]
            self.grammar.accepted(kept, tokens)
            result.handles = [r.handle for r in kept]
            result.token_ids = tokens
            if any(entry is not None for entry in logprobs):
                result.logprobs = [None if e is None else
                                   (e.logprob, e.rank, e.top_ids, e.top_logprobs)
                                   for e in logprobs]
        for request, row, position, count in inputs.prompt_scoring:
            logits = self.model.compute_logits(hidden[row:row + count])
            targets = request.token_ids[position:position + count]
            entries = score_tokens(logits, targets, request.sampling.prompt_logprobs)
            result.prompt_logprobs.append((request.handle, position, entries))

    def _new_lora_registry(self):
        """The adapters (docs/lora.md), with the start-time ones loaded; None: LoRA off."""
        config = self.config
        if not config.enable_lora:
            return None
        from folio.executor.lora.cpu_pools import native_lora_unavailable
        from folio.executor.lora.registry import LoraRegistry
        from folio.executor.lora.tensor_parallel import shard_adapter

        tp = self.tp
        why_not = native_lora_unavailable(self.device, self.dtype)
        if self.device.type == "cpu":
            log.info("LoRA: %s", "the C++ segmented operator, one call per projection"
                     if why_not is None else f"torch matmuls per adapter ({why_not})")
        registry = LoraRegistry(self.model, tp.full if tp is not None else self.model_config,
                                ARCHITECTURES[self.model_config.architecture].weights,
                                self.device, self.dtype, config.max_loras,
                                config.max_lora_rank, config.lora_capacity,
                                segmented=self.device.type == "cuda",
                                native=why_not is None,
                                shard=None if tp is None else lambda w: shard_adapter(w, tp))
        for name, path in config.lora_paths.items():
            registry.load(name, path)
        return registry

    def _new_grammar(self) -> GrammarMasks:
        return GrammarMasks(self.config.tokenizer_path, self.model_config.vocab_size,
                            self.model_config.eos_token_ids)

    def _new_batch(self) -> InputBatch:
        return InputBatch(self.config.block_size, self.device, self.max_model_len,
                          self.config.max_num_seqs)

    def _max_model_len(self) -> int:
        limit = self.model_config.context_limit
        wanted = self.config.max_model_len
        if wanted is None:
            return limit
        if wanted > limit:
            raise ValueError(f"max_model_len {wanted} is larger than the model supports "
                             f"({limit})")
        return wanted

    def _num_kv_blocks(self) -> int:
        if self.config.num_kv_blocks is not None:
            return self.config.num_kv_blocks
        if self.device.type == "cuda":
            free, total = torch.cuda.mem_get_info(self.device)
            budget = total * self.config.gpu_memory_utilization - (total - free)
            budget -= self._activation_reserve()
        else:
            budget = self.config.cpu_kv_cache_gib * 2**30
        budget -= self.num_state_slots * self.state_bytes   # one accounting: states first
        blocks = int(budget // self.bytes_per_block)
        if blocks < 1:
            raise ValueError("no memory left for the KV cache; lower max_num_batched_tokens "
                             "or raise gpu_memory_utilization / cpu_kv_cache_gib")
        return blocks

    def _num_swap_blocks(self) -> int:
        if self.config.num_swap_blocks is not None:
            return self.config.num_swap_blocks
        if self.config.preemption_mode == "recompute":
            return 0
        # A hybrid's host state slots come out of the same budget first.
        budget = self.config.swap_space * 2**30 - self.num_swap_state_slots * self.state_bytes
        return max(0, int(budget // self.bytes_per_block))

    @torch.inference_mode()
    def _measure_costs(self) -> tuple[float, float]:
        """(prefill tokens/s, swap bytes/s) for the scheduler's swap-or-recompute estimate."""
        cfg = self.model_config
        tokens = min(self.config.max_num_batched_tokens, 512)
        x = torch.randn(tokens, cfg.hidden_size, dtype=self.dtype, device=self.device)
        linear = torch.nn.Linear(cfg.hidden_size, cfg.intermediate_size, bias=False,
                                 dtype=self.dtype, device=self.device)
        if self.linear_backend in ("onednn", "bf16-tiles"):   # time the matmul it runs
            linear = float_linear(linear, self.linear_backend)
        elif self.linear_backend in ("int8", "int4"):
            linear = WeightOnlyLinear.from_linear(linear, int(self.linear_backend[3:]),
                                                  cpu_attention.load().ok)
        linear(x)
        if self.device.type == "cuda":
            torch.cuda.synchronize()
        start = time.perf_counter()
        for _ in range(3):
            linear(x)
        if self.device.type == "cuda":
            torch.cuda.synchronize()
        flops = 3 * 2 * tokens * cfg.hidden_size * cfg.intermediate_size / max(
            time.perf_counter() - start, 1e-9)
        swap = measure_swap_bytes_per_s(self.kv_caches[0][0]) if self.num_swap_blocks else 0.0
        return flops / (2 * self.num_params), swap

    def _activation_reserve(self) -> int:
        # Logits plus a few hidden-sized buffers for a full token budget, with headroom.
        cfg = self.model_config
        tokens = self.config.max_num_batched_tokens
        element = torch.empty((), dtype=self.dtype).element_size()
        per_token = 4 * cfg.vocab_size + element * (4 * cfg.hidden_size
                                                    + 3 * cfg.intermediate_size)
        return int(per_token * tokens * 2) + 512 * 2**20
