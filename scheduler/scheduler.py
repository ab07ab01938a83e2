"""Iteration-level scheduling over a paged KV cache.

Each step gives every scheduled request a number of tokens to compute from a shared token
budget: running requests first (decodes and unfinished prompt chunks, in admission order),
then waiting requests in FCFS order while their prompt's blocks are free. When a running
request needs a block and none is free, the most recently admitted request is preempted by
recompute: its blocks are freed and it goes back to the head of the queue, keeping the
tokens it has produced so far.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass

from scheduler.block_pool import BlockPool
from scheduler.kv_manager import KVCacheManager
from scheduler.request import Request, RequestStatus
from scheduler.stop import finish_reason_after_token
from shared.config import SchedulerConfig
from shared.outputs import EngineOutput, FinishReason
from shared.sampling_params import SamplingParams
from shared.step import NewRequest, StepPlan, StepResult


@dataclass(slots=True)
class _Scheduled:
    request: Request
    num_new_tokens: int
    new_blocks: list[int]


class Scheduler:
    def __init__(self, config: SchedulerConfig) -> None:
        self.config = config
        self.pool = BlockPool(config.num_kv_blocks)
        self.kv = KVCacheManager(self.pool, config.block_size)
        self.waiting: deque[Request] = deque()
        self.running: list[Request] = []          # admission order: last = newest
        self.requests: dict[str, Request] = {}
        self._by_handle: dict[int, Request] = {}
        self._forget_handles: list[int] = []      # the executor must drop these next step
        self._pending_outputs: list[EngineOutput] = []
        self._next_handle = 0
        self._next_step = 0
        self._arrivals = 0
        self.num_preemptions_recompute = 0
        self.num_finished = 0

    # ---- requests in and out ------------------------------------------------------------

    def add_request(self, request_id: str, prompt_token_ids: list[int],
                    sampling: SamplingParams) -> None:
        """Queue a request; raises ValueError (and allocates nothing) if it can never run."""
        if request_id in self.requests:
            raise ValueError(f"request id {request_id!r} is already in use")
        self._validate_prompt(prompt_token_ids)
        request = Request(request_id, self._next_handle, list(prompt_token_ids), sampling,
                          self._arrivals)
        self._next_handle += 1
        self._arrivals += 1
        self.requests[request_id] = request
        self._by_handle[request.handle] = request
        self.waiting.append(request)

    def abort_request(self, request_id: str) -> bool:
        request = self.requests.get(request_id)
        if request is None:
            return False
        self._finish(request, FinishReason.ABORT)
        self._pending_outputs.append(EngineOutput(request_id, [], FinishReason.ABORT))
        return True

    def has_unfinished_requests(self) -> bool:
        return bool(self.waiting or self.running)

    def has_work(self) -> bool:
        """Anything to schedule, report, or tell the executor to forget."""
        return bool(self.waiting or self.running or self._pending_outputs
                    or self._forget_handles)

    # ---- one iteration ------------------------------------------------------------------

    def schedule(self) -> StepPlan:
        budget = self.config.max_num_batched_tokens
        scheduled: list[_Scheduled] = []
        preempted = False

        index = 0
        while index < len(self.running) and budget > 0:
            request = self.running[index]
            num_new = self._tokens_to_schedule(request, budget)
            if num_new == 0:
                index += 1
                continue
            new_blocks = self.kv.grow(request, request.num_computed_tokens + num_new)
            while new_blocks is None:
                victim = self.running[-1]
                self._preempt(victim)
                preempted = True
                if victim is request:
                    break
                new_blocks = self.kv.grow(request, request.num_computed_tokens + num_new)
            if new_blocks is None:
                break
            scheduled.append(_Scheduled(request, num_new, new_blocks))
            budget -= num_new
            index += 1

        # A step that had to preempt admits nobody: memory is already short.
        while (not preempted and self.waiting and budget > 0
               and len(self.running) < self.config.max_num_seqs):
            request = self.waiting[0]
            if self.kv.num_missing_blocks(request, request.num_tokens) > self.pool.num_free:
                break
            num_new = self._tokens_to_schedule(request, budget)
            if num_new == 0:
                break
            new_blocks = self.kv.grow(request, request.num_computed_tokens + num_new)
            assert new_blocks is not None, "admission checked the free blocks"
            self.waiting.popleft()
            request.status = RequestStatus.RUNNING
            self.running.append(request)
            scheduled.append(_Scheduled(request, num_new, new_blocks))
            budget -= num_new

        return self._build_plan(scheduled)

    def update(self, plan: StepPlan, result: StepResult) -> list[EngineOutput]:
        """Apply a step's sampled tokens; return what each request produced or how it ended."""
        outputs, self._pending_outputs = self._pending_outputs, []
        limit = self.config.max_request_len
        for handle, token_id in zip(result.handles, result.token_ids):
            request = self._by_handle.get(handle)
            if request is None or request.status is not RequestStatus.RUNNING:
                continue  # aborted while its step was in flight
            request.output_token_ids.append(token_id)
            reason = finish_reason_after_token(request, token_id, self.config.eos_token_ids, limit)
            if reason is not None:
                self._finish(request, reason)
            outputs.append(EngineOutput(request.request_id, [token_id], reason))
        return outputs

    def take_pending_outputs(self) -> list[EngineOutput]:
        outputs, self._pending_outputs = self._pending_outputs, []
        return outputs

    # ---- introspection ------------------------------------------------------------------

    def stats(self) -> dict[str, int | float]:
        slots = self.pool.num_used * self.config.block_size
        filled = sum(r.num_computed_tokens for r in self.running)
        return {
            "kv_blocks_total": self.pool.num_blocks,
            "kv_blocks_free": self.pool.num_free,
            "kv_blocks_used": self.pool.num_used,
            "kv_slot_utilization": filled / slots if slots else 1.0,
            "preemptions_recompute": self.num_preemptions_recompute,
            "num_running": len(self.running),
            "num_waiting": len(self.waiting),
            "num_finished": self.num_finished,
            "steps": self._next_step,
        }

    # ---- internals ----------------------------------------------------------------------

    def _validate_prompt(self, prompt_token_ids: list[int]) -> None:
        if not prompt_token_ids:
            raise ValueError("prompt must contain at least one token")
        limit = self.config.max_request_len
        if len(prompt_token_ids) > limit:
            what = ("max_model_len" if limit == self.config.max_model_len
                    else "the KV cache's capacity (num_kv_blocks * block_size)")
            raise ValueError(f"prompt has {len(prompt_token_ids)} tokens, more than {what} = "
                             f"{limit}")
        vocab = self.config.vocab_size
        for token_id in prompt_token_ids:
            if isinstance(token_id, bool) or not isinstance(token_id, int) or not (
                    0 <= token_id < vocab):
                raise ValueError(f"prompt token id {token_id!r} is outside the vocabulary "
                                 f"[0, {vocab})")

    def _tokens_to_schedule(self, request: Request, budget: int) -> int:
        remaining = request.num_uncomputed_tokens
        if self.config.enable_chunked_prefill:
            return min(remaining, budget)
        return remaining if remaining <= budget else 0

    def _preempt(self, request: Request) -> None:
        self.running.remove(request)
        self.kv.free(request)
        self._forget_on_executor(request)
        request.num_computed_tokens = 0
        request.status = RequestStatus.WAITING
        request.num_preemptions += 1
        self.waiting.appendleft(request)
        self.num_preemptions_recompute += 1

    def _finish(self, request: Request, reason: str) -> None:
        if request.status is RequestStatus.RUNNING:
            self.running.remove(request)
        elif request.status is RequestStatus.WAITING:
            self.waiting.remove(request)
        self.kv.free(request)
        self._forget_on_executor(request)
        request.status = RequestStatus.FINISHED
        request.finish_reason = reason
        del self.requests[request.request_id]
        del self._by_handle[request.handle]
        self.num_finished += 1

    def _forget_on_executor(self, request: Request) -> None:
        if request.on_executor:
            self._forget_handles.append(request.handle)
            request.on_executor = False

    def _build_plan(self, scheduled: list[_Scheduled]) -> StepPlan:
        plan = StepPlan(step_id=self._next_step)
        self._next_step += 1
        plan.finished_handles, self._forget_handles = self._forget_handles, []
        for item in scheduled:
            request = item.request
            if request.on_executor:
                plan.running_handles.append(request.handle)
                plan.running_num_tokens.append(item.num_new_tokens)
                if item.new_blocks:
                    plan.new_block_ids[request.handle] = item.new_blocks
            else:
                plan.new_requests.append(NewRequest(
                    handle=request.handle,
                    token_ids=request.all_token_ids,
                    prompt_len=len(request.prompt_token_ids),
                    num_computed_tokens=request.num_computed_tokens,
                    num_new_tokens=item.num_new_tokens,
                    block_ids=list(request.block_ids),
                    sampling=request.sampling,
                ))
                request.on_executor = True
            request.num_computed_tokens += item.num_new_tokens
        return plan
