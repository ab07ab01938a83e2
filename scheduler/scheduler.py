"""Iteration-level scheduling over a paged KV cache.

Each step gives every scheduled request a number of tokens to compute from a shared token
budget, in this order: running requests (decodes and unfinished prompt chunks, oldest first),
then swapped-out requests coming back, then waiting requests in FCFS order while their
prompt's blocks are free. A waiting request first takes every cached block of its prefix.

When a running request needs a block and none is free, the most recently admitted request
is preempted (never one that was just resumed while an older one could go): its KV is
either copied to the CPU swap pool or dropped and recomputed later, as the preemption mode
and its cost estimate say. Either way it keeps the tokens it has produced so far.

With scheduling_policy "priority" (vLLM's), every queue and the running list are ordered by
priority first, lower values first: the least urgent, newest request is the one preempted,
and a waiting request that cannot be admitted preempts running ones of a strictly less
urgent priority until it can. A request's priority is aged by the steps it waited
(scheduler/fairness/aging.py), so urgent traffic cannot hold it back for ever.

Within a priority (and under FCFS, one priority) the queues go by each client's virtual
clock (scheduler/fairness/client_clocks.py): clients take turns, and one client's thousands
of waiting requests do not stand in front of another's first; one client alone is FCFS.

A waiting request that the LoRA slot limit (max_loras) holds back does not hold back the
requests behind it that fit (as vLLM skips it), but at most max_num_seqs of them pass it
before the queue waits for its adapter's turn again: it is not starved.

Block tables are KVCacheManager's alone (scheduler/kv/kv_manager.py holds and writes them):
this module works in token counts, asks it for slots, forks and swaps, puts the pairs it
returns in the plan, and asks it for a request's table when the plan sends it whole.

`n > 1` runs as n sibling requests: the first computes the prompt; the others then fork
from it, sharing its full prompt blocks by reference count and copying the partial one.

A pooling request (SamplingParams.pooling: embeddings, rerank, score) arrives with
max_tokens 1 and runs as a prefill: the executor returns its pooled vector instead of a
sample (StepResult.pooled), and it ends then, its blocks freed. Mean pooling takes no
prefix-cache hits and is recomputed, never swapped, when preempted.

A full block enters the prefix cache when the step computing its last token is scheduled,
so a request admitted later in the same step shares it; a failed step takes its
registrations back (discard_unconfirmed).

Sliding-window models (the executor's hello says so only when EVERY layer is windowed):
each time a request is scheduled, its blocks wholly before its next token's window are
released and their entries name the null block (scheduler/kv/kv_manager.py). A request then
holds at most config.window_peak_blocks blocks; admission asks only for that many, and when
the pool holds that peak a prompt may be longer than the pool (max_request_len). Swapping
moves only the live blocks; a fork shares only the blocks its first token's window reads.

The scheduler may plan a step before the previous step's result is applied (one step in
flight): each request counts the tokens steps in flight will sample (num_pending), and the
next step computes them, since the executor appends its own samples. Tokens are learned, and
stop conditions checked, when results arrive; a step planned past a stop is thrown away.
"""

from __future__ import annotations

import bisect
import time
from collections import deque
from dataclasses import dataclass, replace
from itertools import repeat

from folio.scheduler.kv.block_pool import BlockPool
from folio.scheduler.fairness.aging import aged
from folio.scheduler.fairness.client_clocks import ClientClocks
from folio.scheduler.kv_events import KVEventLog
from folio.scheduler.kv.kv_manager import CachedPrefix, KVCacheManager
from folio.scheduler.kv.kv_map import build_kv_map
from folio.scheduler.preemption import should_swap
from folio.scheduler.request import Request, RequestStatus
from folio.scheduler.multi_step import BurstPlanner
from folio.scheduler.spec_decode import DraftPlanner
from folio.scheduler.stop import finish_reason_after_token, stop_triggers
from folio.shared.config import SchedulerConfig
from folio.shared.outputs import EngineOutput, FinishReason, StepOutputs, child_request_id
from folio.shared.protocol.codes import RefusalCode
from folio.shared.prefix_hash import adapter_seed
from folio.shared.request_limits import ids_problem, length_problem
from folio.shared.sampling_params import SamplingParams, check_against_model
from folio.shared.protocol.step import NewRequest, StepPlan, StepResult


# A pooling request that needs every prompt position computed ("mean") takes no prefix
# hits: the executor never saw the hidden states of cached tokens (executor/pooling/).
NO_PREFIX = CachedPrefix([], 0)
# Waiting requests held back by the LoRA slot limit that one step looks past, at most: a
# long queue for another adapter costs a step this many checks, not the queue's length.
MAX_LORA_SKIPS = 256


@dataclass(slots=True)
class _Scheduled:
    request: Request
    num_new_tokens: int
    new_blocks: list[int] | tuple[()]
    samples: bool   # it reaches the end of its tokens: the executor samples one more


class Scheduler:
    def __init__(self, config: SchedulerConfig, kv_events: KVEventLog | None = None) -> None:
        self.config = config
        self.kv = KVCacheManager(config, kv_events)   # holds and writes every block table
        self.waiting: deque[Request] = deque()
        self.swapped: deque[Request] = deque()
        self.running: list[Request] = []          # by _run_key: last = newest (least urgent)
        self._by_priority = config.scheduling_policy == "priority"
        self.clocks = ClientClocks()
        self.requests: dict[str, Request] = {}
        self._by_handle: dict[int, Request] = {}
        # Finished, aborted and preempted requests whose executor-side state the next plan
        # drops (StepPlan.dropped_handles).
        self._dropped_handles: list[int] = []
        self._pending_outputs: list[EngineOutput] = []
        self._next_handle = 0
        # LoRA (docs/lora.md): how many times each adapter name was unloaded, so an adapter
        # loaded again under a name never meets its predecessor's cached blocks.
        self._lora_unloads: dict[str, int] = {}
        self.loras: set[str] = set(config.loras)   # adapters requests may name now
        self._next_step = 0
        self._next_admit = 0
        self.counters = dict.fromkeys((
            "preemptions_recompute", "preemptions_swap", "prefix_cache_queries",
            "prefix_cache_hits", "num_finished", "forks"), 0)
        # Speculative decoding (scheduler/spec_decode.py); None: off. Not for sliding-window
        # models (the window's block accounting counts verified tokens only).
        # Multi-step decoding (scheduler/multi_step.py) plans its bursts the same way, when
        # speculation is off.
        speculative = config.speculative
        self.drafts = None
        if config.sliding_window is None and speculative is not None:
            self.drafts = DraftPlanner(speculative)
        elif config.sliding_window is None and config.num_scheduler_steps > 1:
            self.drafts = BurstPlanner(config.num_scheduler_steps)
        self.bursts = isinstance(self.drafts, BurstPlanner)

    # ---- requests in and out ------------------------------------------------------------

    def add_request(self, request_id: str, prompt_token_ids: list[int],
                    sampling: SamplingParams, client: str | None = None) -> list[str]:
        """Queue a request; returns the ids its outputs will carry (one per sample).
        Raises ValueError, allocating nothing, if it can never run: the offline engine and
        the server refuse the same requests. `client`: who sent it, for the turns clients
        take (None: the anonymous client)."""
        self._check_fits(prompt_token_ids, sampling.max_tokens)
        # The frontend checked these too; the scheduler does not trust its peers.
        check_against_model(sampling, self.config.vocab_size, self.config.max_logprobs,
                            self.config.max_n)
        if sampling.lora is not None and sampling.lora not in self.loras:
            raise ValueError(f"no LoRA adapter named {sampling.lora!r} is loaded")
        if sampling.priority and not self._by_priority:
            raise ValueError(f"priority {sampling.priority} needs the engine started with "
                             "--scheduling-policy priority")
        n = sampling.n
        ids = [child_request_id(request_id, i, n) for i in range(n)]
        if any(i in self.requests for i in ids):
            raise ValueError(f"request id {request_id!r} is already in use")
        children = [self._new_request(ids[i], prompt_token_ids, _child_params(sampling, i))
                    for i in range(n)]
        order = self._order(client, sampling, len(prompt_token_ids))
        for child in children:
            child.client, child.queue_key = client, (*order, child.handle)
        first = children[0]
        first.fork_children = children[1:]
        for child in first.fork_children:
            child.status = RequestStatus.FORKING
        self._enqueue(self.waiting, first)
        return ids

    def abort_request(self, request_id: str) -> bool:
        """Abort a request id as given to add_request (all its samples) or one sample."""
        # Lookups, not a scan of every request: an abort costs the same however many are
        # queued, so a burst of aborts (a client cut off) stays linear.
        exact = self.requests.get(request_id)
        targets = [exact] if exact is not None else [
            r for r in map(self.requests.get, (f"{request_id}#{i}"
                                               for i in range(self.config.max_n)))
            if r is not None]
        for request in targets:
            self._finish(request, FinishReason.ABORT)
            self._pending_outputs.append(EngineOutput(request.request_id, [],
                                                      FinishReason.ABORT))
        return bool(targets)

    def has_unfinished_requests(self) -> bool:
        return bool(self.requests)

    def has_work(self) -> bool:
        """Anything to schedule, report, or tell the executor."""
        return bool(self.requests or self._pending_outputs or self._dropped_handles)

    def take_pending_outputs(self) -> list[EngineOutput]:
        outputs, self._pending_outputs = self._pending_outputs, []
        return outputs

    # ---- one iteration ------------------------------------------------------------------

    def schedule(self) -> StepPlan:
        step = self._next_step
        self._next_step += 1
        self.kv.begin_step(step)
        plan = StepPlan(step_id=step)
        budget = self.config.max_num_batched_tokens
        scheduled: list[_Scheduled] = []
        preempted = False
        made_room = self._by_priority and self.waiting and self._preempt_for_priority(plan)

        chunked = self.config.enable_chunked_prefill
        running = self.running
        add_handle = plan.running_handles.append
        add_count = plan.running_num_tokens.append
        appended = plan.new_block_ids
        allocate_slots = self.kv.allocate_slots
        drafts = self.drafts if self.drafts is not None and \
            self.drafts.step_allows(len(running)) else None
        # The decode loop runs for every running request every step, so it reads the
        # token counts cached on the request (num_tokens, stop_num_tokens: see
        # scheduler/request.py) rather than working them out, and makes one call to the
        # KV manager. Preemption removes only requests not yet scheduled (this one or later
        # ones), which the list iterator tolerates; a preempted `request` ends the loop.
        for request in running:   # budget > 0: max_num_batched_tokens is positive
            computed = request.num_computed_tokens
            pending = request.num_pending
            total = request.num_tokens + pending
            # One step ahead: the step in flight samples `pending` more tokens, and they
            # end it by length (max_tokens or the context), whatever they are.
            if pending and total >= request.stop_num_tokens:
                continue
            remaining = total - computed
            num_new = remaining if remaining <= budget else budget if chunked else 0
            if num_new == 0:
                continue
            end = computed + num_new
            # Slots for the new tokens (and their full blocks registered for this step),
            # past the positions the drafts of steps in flight may fill (their count is
            # learned with their results; a decode step registers the same blocks).
            extra = request.num_draft_slots
            new_blocks = allocate_slots(request, num_new + extra, step)
            if new_blocks is None:
                index = running.index(request)   # rare: the pool is short
                while new_blocks is None:
                    victim = self._pick_victim(index, step)
                    self._preempt(victim, plan)
                    preempted = True
                    if victim is request:
                        break
                    new_blocks = allocate_slots(request, num_new + extra, step)
                if new_blocks is None:
                    break
            if request.on_executor:   # the common case goes into the plan at once
                if drafts is not None and remaining == num_new == 1:
                    new_blocks, budget = self._plan_drafts(request, new_blocks, budget, plan,
                                                           step, drafts)
                add_handle(request.handle)
                add_count(num_new)
                if new_blocks:
                    appended[request.handle] = new_blocks
                request.num_computed_tokens = end
                if num_new == remaining:
                    request.num_pending = pending + 1
            else:
                scheduled.append(_Scheduled(request, num_new, new_blocks, num_new == remaining))
            budget -= num_new
            if budget <= 0:
                break

        # A step that had to preempt brings nobody in: memory is already short.
        # Under the priority policy a waiting request more urgent than every swapped one goes
        # first, and a victim preempted for it this step is not brought straight back.
        urgent = self._by_priority and self.waiting and (made_room or not self.swapped or (
            _more_urgent(self.waiting[0], self.swapped[0])))
        if not preempted and not urgent:
            budget = self._swap_in(plan, scheduled, budget, step)
        if not preempted and (urgent or not self.swapped):
            self._admit(scheduled, budget, step)
        return self._build_plan(plan, scheduled)

    def _plan_drafts(self, request: Request, new_blocks: list[int] | tuple[()], budget: int,
                     plan: StepPlan, step: int, drafts: DraftPlanner
                     ) -> tuple[list[int] | tuple[()], int]:
        """A decode step's draft cap and the slots it needs (before its verified token
        is counted computed): every position the steps in flight and this one may write.
        No drafts when the pool would have to preempt for them."""
        cap = drafts.cap(request, step, budget)
        if cap <= 0:
            return new_blocks, budget
        extra = self.kv.reserve_slots(
            request, request.num_computed_tokens + 1 + request.num_draft_slots + cap)
        if extra is None:
            return new_blocks, budget
        drafts.planned(request, step, cap)
        plan.drafts[request.handle] = cap
        budget -= drafts.tokens_in_pass(cap)
        return ([*new_blocks, *extra] if extra else new_blocks), budget

    def plan_for_executor(self) -> StepPlan | None:
        """What one step is, for the in-process engine (folio/engine.py) and the scheduler
        process (scheduler/service.py) alike: plan it; None when the executor has nothing to
        do in it (no tokens to compute, no handles to forget; outputs already decided, e.g.
        aborts, still wait in take_pending_outputs). The executor runs the plan, and update
        applies its result."""
        plan = self.schedule()
        if plan.is_empty and not plan.dropped_handles:
            return None
        return plan

    def update(self, plan: StepPlan, result: StepResult) -> StepOutputs:
        """Apply a step's sampled tokens; return what each request produced or how it ended
        (columnar: plain tokens apart from the entries that carry more)."""
        outputs, self._pending_outputs = self._pending_outputs, []
        plain_ids: list[str] = []
        plain_tokens: list[int] = []
        self.kv.confirm_through(plan.step_id)
        by_handle = self._by_handle
        # Requests with several tokens this step (accepted drafts, a burst) report them in
        # one entry, in order; entries come out before the plain tokens.
        several: set[int] | frozenset[int] = frozenset()
        groups: dict[int, EngineOutput] = {}   # by handle, the entry of its several tokens
        if plan.drafts and self.drafts is not None:   # before the tokens are appended
            self.drafts.apply(plan, result, by_handle)
            several = {handle for handle, _, accepted in result.drafts if accepted}
        for handle, start, entries in result.prompt_logprobs:
            request = by_handle.get(handle)
            if request is None:
                continue   # finished while its step was in flight
            # A recomputed prompt scores its positions again: report each one once.
            skip = max(0, request.prompt_logprobs_next - start)
            if skip < len(entries):
                request.prompt_logprobs_next = start + len(entries)
                outputs.append(EngineOutput(request.request_id, [],
                                            prompt_logprobs=entries[skip:]))
        for handle, reason in result.failed:   # this request alone: the step went on
            request = by_handle.get(handle)
            if request is not None:   # else it finished while its step was in flight
                self._finish(request, FinishReason.ERROR)
                lora = request.sampling.lora
                if lora is not None:   # the likeliest cause is its own adapter: say which
                    reason = f"{reason} (with LoRA adapter {lora!r})"
                outputs.append(EngineOutput(request.request_id, [], FinishReason.ERROR,
                                            reason, error_code=RefusalCode.REQUEST_FAILED))
        for handle, vector in result.pooled:   # pooling requests: their prompt is done
            request = by_handle.get(handle)
            if request is not None:   # else it finished while its step was in flight
                self._finish(request, FinishReason.STOP)
                outputs.append(EngineOutput(request.request_id, [], FinishReason.STOP,
                                            queued_s=request.queue_s, pooled=vector))
        logprobs = result.logprobs or repeat(None)
        register_full_blocks = self.kv.register_full_blocks
        registered_step = self._next_step - 1
        find = by_handle.get
        add_plain_id, add_plain_token = plain_ids.append, plain_tokens.append
        for handle, token_id, entry in zip(result.handles, result.token_ids, logprobs):
            request = find(handle)
            if request is None:   # finished or aborted while its step was in flight
                continue
            # A request preempted after this step was sent (one step ahead) keeps the token:
            # the step ran before the executor forgot it.
            request.output_token_ids.append(token_id)
            num_tokens = request.num_tokens + 1
            request.num_tokens = num_tokens
            request.num_pending -= 1
            # A step planned ahead computes the token just learned: its block may be full now.
            computed = request.num_computed_tokens
            if computed >= num_tokens:
                register_full_blocks(request, computed, registered_step)
            # The common case, tested in line: a plain token (no logprobs, not the first,
            # which reports its queue time and may start forks) that stops nothing.
            if (entry is None and request.prompt_len + 1 < num_tokens < request.stop_num_tokens
                    and token_id not in request.stop_ids and handle not in several):
                add_plain_id(request.request_id)
                add_plain_token(token_id)
                continue
            if request.fork_children:   # only ever before the first token
                self._fork(request)
            reason = finish_reason_after_token(request, token_id)
            if (reason is None and entry is None and num_tokens > request.prompt_len + 1
                    and handle not in several):
                add_plain_id(request.request_id)
                add_plain_token(token_id)
                continue
            if reason is not None:
                self._finish(request, reason)
            grouped = groups.get(handle)
            if grouped is not None:   # a later token of several: one entry carries them all
                grouped.new_token_ids.append(token_id)
                grouped.finish_reason = reason
                if entry is not None:
                    grouped.logprobs.append(entry)
                continue
            output = EngineOutput(
                request.request_id, [token_id], reason,
                logprobs=None if entry is None else [entry],
                queued_s=request.queue_s if num_tokens == request.prompt_len + 1 else None)
            outputs.append(output)
            if handle in several:
                groups[handle] = output
        if several:   # blocks its accepted drafts filled were written by this step
            self.kv.confirm_through(plan.step_id)
        return StepOutputs(plain_ids, plain_tokens, outputs)

    def discard_unconfirmed(self) -> None:
        """A step failed: blocks registered for steps that never returned may hold garbage,
        so no later request may find them. Call it before failing the requests."""
        self.kv.discard_unconfirmed()

    # ---- introspection ------------------------------------------------------------------

    def stats(self) -> dict[str, int | float]:
        return {
            **self.kv.stats(self.running),
            "num_running": len(self.running),
            "num_waiting": len(self.waiting) + sum(len(r.fork_children) for r in self.waiting),
            "num_swapped": len(self.swapped),
            "steps": self._next_step,
            **self.counters,
            **(self.drafts.stats() if self.drafts is not None else {}),
            **(self._lora_stats() if self.loras else {}),
        }

    def kv_map(self) -> dict:
        """Every block's state and owner, every request's table (scheduler/kv/kv_map.py)."""
        return build_kv_map(self.kv, self.config, running=self.running, swapped=self.swapped,
                            waiting=self.waiting, num_requests=len(self.requests),
                            steps=self._next_step,
                            speculative=None if self.drafts is None else self.drafts.summary())

    def kv_slot_utilization(self) -> float:
        """Fraction of the slots in used blocks that hold a computed token."""
        return self.kv.slot_utilization(self.running)

    # Read-only views of the pools, for the page map, the benches and tests.
    @property
    def pool(self) -> BlockPool:
        return self.kv.pool

    @property
    def swap_pool(self) -> BlockPool:
        return self.kv.swap.pool

    # ---- phases -------------------------------------------------------------------------

    def _swap_in(self, plan: StepPlan, scheduled: list[_Scheduled], budget: int,
                 step: int) -> int:
        while self.swapped and budget > 0 and len(self.running) < self.config.max_num_seqs:
            request = self.swapped[0]
            if request.sampling.lora is not None and not self._lora_fits(request):
                break
            num_new = self._tokens_to_schedule(request, budget)
            if num_new == 0:
                break
            pairs = self.kv.swap_in(request, num_new, step)   # registers full blocks too
            if pairs is None:
                break
            self.swapped.popleft()
            plan.swap_in.extend(pairs)
            self._resume(request, step)
            # Not on the executor since its swap-out: the plan sends its whole table.
            scheduled.append(_Scheduled(request, num_new, [],
                                        num_new == request.num_uncomputed_tokens))
            budget -= num_new
        return budget

    def _admit(self, scheduled: list[_Scheduled], budget: int, step: int) -> None:
        waiting, max_seqs = self.waiting, self.config.max_num_seqs
        index = 0              # the first waiting request not skipped
        skipped: list[Request] = []   # held back by the LoRA slot limit this step
        adapters: set[str] | None = None   # the running requests' adapters, once needed
        while index < len(waiting) and budget > 0 and len(self.running) < max_seqs:
            request = waiting[index]
            if request.num_pending:
                # Preempted while a step that samples for it is in flight: it goes back in
                # once that result has arrived (a request is sent with no token in flight).
                index += 1
                continue
            lora = request.sampling.lora
            if lora is not None:
                if adapters is None:
                    adapters = {r.sampling.lora for r in self.running} - {None}
                if lora not in adapters and len(adapters) >= self.config.max_loras:
                    if request.lora_passes >= max_seqs or len(skipped) >= MAX_LORA_SKIPS:
                        break   # its turn: nobody else passes it (or the scan is long)
                    skipped.append(request)
                    index += 1
                    continue
            cached = self.kv.find_cached_prefix(request) \
                if request.sampling.pooling != "mean" else NO_PREFIX
            if not self.kv.can_admit(request, cached):
                break
            request.num_computed_tokens = cached.num_tokens
            num_new = self._tokens_to_schedule(request, budget)
            if num_new == 0:
                request.num_computed_tokens = 0
                break
            # Registered now, so the next request admitted in this step shares them.
            new_blocks = self.kv.admit(request, cached, num_new, step)
            self.counters["prefix_cache_queries"] += request.num_tokens
            self.counters["prefix_cache_hits"] += request.num_computed_tokens
            if index:
                del waiting[index]
            else:
                waiting.popleft()
            for passed in skipped:
                passed.lora_passes += 1
            if lora is not None and adapters is not None:
                adapters.add(lora)
            if request.admit_seq < 0:
                request.admit_seq = self._next_admit
                self._next_admit += 1
                request.queue_s = time.monotonic() - request.arrival_time
            self._resume(request, step)
            scheduled.append(_Scheduled(request, num_new, new_blocks,
                                        num_new == request.num_uncomputed_tokens))
            budget -= num_new

    def _fork(self, first: Request) -> None:
        """First sample's prompt is computed: start its siblings from its blocks."""
        prompt_len = first.prompt_len
        children, first.fork_children = first.fork_children, []
        running = first.status is RequestStatus.RUNNING   # not if preempted meanwhile
        for child in children:
            if not (running and len(self.running) < self.config.max_num_seqs
                    and self.kv.fork(first, child)):
                child.status = RequestStatus.WAITING   # falls back to computing its prompt
                self._enqueue(self.waiting, child)
                continue
            child.num_computed_tokens = prompt_len - 1   # recomputes only the last token
            child.admit_seq = first.admit_seq
            child.status = RequestStatus.RUNNING
            bisect.insort(self.running, child, key=self._run_key)
            self.counters["forks"] += 1

    # ---- LoRA adapters (docs/lora.md) ---------------------------------------------------

    def lora_requests(self, name: str) -> int:
        """Unfinished requests that run with adapter `name`."""
        return sum(r.sampling.lora == name for r in self.requests.values())

    def forget_lora(self, name: str) -> None:
        """Adapter `name` is being unloaded: no request may name it any more, and a later
        adapter of that name hashes its blocks apart."""
        self.loras.discard(name)
        self._lora_unloads[name] = self._lora_unloads.get(name, 0) + 1

    def _lora_stats(self) -> dict[str, dict[str, int]]:
        """Unfinished requests per adapter: running (and swapped), waiting."""
        running: dict[str, int] = {}
        waiting: dict[str, int] = {}
        for queue, counts in ((self.running, running), (self.swapped, running),
                              (self.waiting, waiting)):
            for request in queue:
                name = request.sampling.lora
                if name is not None:
                    counts[name] = counts.get(name, 0) + 1 + len(request.fork_children)
        return {"lora_running": running, "lora_waiting": waiting}

    def _lora_fits(self, request: Request) -> bool:
        """Whether running `request` keeps the running adapters within max_loras."""
        running = {r.sampling.lora for r in self.running} - {None}
        return request.sampling.lora in running or len(running) < self.config.max_loras

    # ---- internals ----------------------------------------------------------------------

    def _new_request(self, request_id: str, prompt: list[int], sampling: SamplingParams
                     ) -> Request:
        request = Request(request_id, self._next_handle, list(prompt), sampling)
        if sampling.lora is not None:
            request.prefix_seed = adapter_seed(sampling.lora,
                                               self._lora_unloads.get(sampling.lora, 0))
        request.stop_length_at, request.stop_ids = stop_triggers(
            request, self.config.eos_token_ids, self.config.max_request_len)
        request.stop_num_tokens = request.prompt_len + request.stop_length_at
        self._next_handle += 1
        self.requests[request_id] = request
        self._by_handle[request.handle] = request
        return request

    def _check_fits(self, prompt_token_ids: list[int], max_tokens: int | None) -> None:
        limit = self.config.max_request_len
        what = ("max_model_len" if limit == self.config.max_model_len
                else "the KV cache's capacity (num_kv_blocks * block_size)")
        # The length first (cheap); an empty prompt always fits and is refused by ids_problem.
        problem = length_problem(len(prompt_token_ids), max_tokens, limit, what) \
            or ids_problem(prompt_token_ids, self.config.vocab_size)
        if problem is not None:
            raise ValueError(problem)

    def _tokens_to_schedule(self, request: Request, budget: int) -> int:
        remaining = request.num_uncomputed_tokens
        if self.config.enable_chunked_prefill:
            return min(remaining, budget)
        return remaining if remaining <= budget else 0

    # ---- order: FCFS, or (priority, arrival) ----------------------------------------------

    def _order(self, client: str | None, sampling: SamplingParams, prompt_len: int
               ) -> tuple[int, int]:
        """The start of a new request's queue key (scheduler/fairness/): by priority, aged;
        within a priority, by its client's clock."""
        config = self.config
        seats = config.max_num_seqs
        priority = sampling.priority if self._by_priority else 0
        # Virtual time in seat-steps (a step is `seats` of them), so a client's clock runs
        # as fast as the whole server would serve it alone. What it asks: its answers, and
        # its prompt's chunks.
        answer = sampling.max_tokens or max(1, config.max_request_len - prompt_len)
        cost = sampling.n * answer + -(-prompt_len // config.max_num_batched_tokens)
        start = self.clocks.start(client, priority, self._next_step * seats, cost)
        aging = config.priority_aging_steps
        if not self._by_priority:
            return 0, start
        if aging <= 0:
            return priority, start
        return 0, aged(priority, start, aging * seats)

    def _run_key(self, request: Request) -> tuple[int, int, int] | int:
        """The running list's order; its tail is where victims are taken. By priority, the
        queues' order (so a victim goes back behind whoever preempted it: no ping-pong)."""
        if self._by_priority:
            major, minor, _ = request.queue_key
            return major, minor, request.admit_seq
        return request.admit_seq

    def _enqueue(self, queue: deque[Request], request: Request) -> None:
        """At its place by its queue key (scheduler/fairness/), fixed at arrival: a preempted
        request goes back before everyone who came after it."""
        key = _queue_key(request)
        if not queue or key >= _queue_key(queue[-1]):
            queue.append(request)   # the common case: the newest arrival
            return
        queue.insert(bisect.bisect_right(queue, key, key=_queue_key), request)

    def _preempt_for_priority(self, plan: StepPlan) -> bool:
        """Before the step schedules anyone: preempt running requests less urgent than the
        first waiting one while it cannot be admitted. Whether it preempted any."""
        head = self.waiting[0]
        preempted = False
        while self.running and _more_urgent(head, self.running[-1]):
            seats = len(self.running) < self.config.max_num_seqs
            if seats and self.kv.can_admit(head, self.kv.find_cached_prefix(head)):
                break
            self._preempt(self.running[-1], plan)
            preempted = True
        return preempted

    def _pick_victim(self, first_unscheduled: int, step: int) -> Request:
        """The newest running request not yet scheduled this step, skipping any resumed in
        the last step while an older candidate exists (no ping-pong)."""
        candidates = self.running[first_unscheduled:]
        for request in reversed(candidates):
            if request.resumed_step < step - 1:
                return request
        return candidates[-1]

    def _preempt(self, request: Request, plan: StepPlan) -> None:
        self.running.remove(request)
        # A hybrid's state swapped out now would hold the drafts its steps in flight accept,
        # which it would then count as uncomputed and feed again: recompute it.
        drafts_in_flight = bool(request.num_draft_slots) and self.config.num_state_slots > 0
        if self.drafts is not None:
            self.drafts.preempted(request)
        self._drop_on_executor(request)
        request.num_preemptions += 1
        live = self.kv.num_live_blocks(request)   # freed (null) entries are not copied
        # Mean pooling sums hidden states the executor forgets at a swap: recompute it.
        if request.sampling.pooling != "mean" and not drafts_in_flight and should_swap(
                self.config, request.num_computed_tokens, live, self.kv.num_free_swap_blocks,
                self.kv.num_free_swap_state_slots):
            plan.swap_out.extend(self.kv.swap_out(request))
            request.status = RequestStatus.SWAPPED
            self._enqueue(self.swapped, request)
            self.counters["preemptions_swap"] += 1
            return
        self.kv.free(request)
        request.num_computed_tokens = 0
        request.status = RequestStatus.WAITING
        self._enqueue(self.waiting, request)
        self.counters["preemptions_recompute"] += 1

    def _resume(self, request: Request, step: int) -> None:
        if request.num_preemptions:
            request.resumed_step = step
        request.status = RequestStatus.RUNNING
        bisect.insort(self.running, request, key=self._run_key)

    def _finish(self, request: Request, reason: str) -> None:
        if request.status is RequestStatus.RUNNING:
            self.running.remove(request)
        elif request.status is RequestStatus.WAITING:
            self.waiting.remove(request)
        elif request.status is RequestStatus.SWAPPED:
            self.swapped.remove(request)
        elif request.status is RequestStatus.FORKING:
            for owner in self.requests.values():
                if request in owner.fork_children:
                    owner.fork_children.remove(request)
        self.kv.forget(request)   # device and swap blocks, its table and hashes
        self._drop_on_executor(request)
        if request.fork_children and request.status is not RequestStatus.FINISHED:
            # The siblings cannot fork from a request that ends before its prompt did.
            for child in request.fork_children:
                child.status = RequestStatus.WAITING
                self._enqueue(self.waiting, child)
            request.fork_children = []
        request.status = RequestStatus.FINISHED
        request.finish_reason = reason
        del self.requests[request.request_id]
        del self._by_handle[request.handle]
        self.counters["num_finished"] += 1

    def _drop_on_executor(self, request: Request) -> None:
        if request.on_executor:
            self._dropped_handles.append(request.handle)
            request.on_executor = False

    def _build_plan(self, plan: StepPlan, scheduled: list[_Scheduled]) -> StepPlan:
        plan.dropped_handles, self._dropped_handles = self._dropped_handles, []
        plan.copies = self.kv.take_copies()
        plan.state_copies, plan.checkpoints = self.kv.take_state_work()
        plan.state_swap_out, plan.state_swap_in = self.kv.take_state_swaps()
        handles, counts, appended = plan.running_handles, plan.running_num_tokens, \
            plan.new_block_ids
        for item in scheduled:
            request = item.request
            if request.on_executor:
                handles.append(request.handle)
                counts.append(item.num_new_tokens)
                if item.new_blocks:
                    appended[request.handle] = item.new_blocks
            else:
                assert not request.num_pending, "a request is sent with tokens still in flight"
                plan.new_requests.append(NewRequest(
                    handle=request.handle,
                    token_ids=request.all_token_ids,
                    prompt_len=request.prompt_len,
                    num_computed_tokens=request.num_computed_tokens,
                    num_new_tokens=item.num_new_tokens,
                    block_ids=self.kv.block_ids(request),
                    sampling=request.sampling,
                    cache_scope=request.client,
                    state_slot=self.kv.state_slot(request),
                ))
                request.on_executor = True
            request.num_computed_tokens += item.num_new_tokens
            if item.samples:
                request.num_pending += 1
        return plan


def _more_urgent(first: Request, other: Request) -> bool:
    """Whether `first` may go before `other` by priority (skip a swapped request, preempt a
    running one): a strictly more urgent priority, and ahead of `other` in the queues' order
    (not aged past by it). Turns between clients never preempt."""
    return (first.sampling.priority < other.sampling.priority
            and first.queue_key < other.queue_key)


def _queue_key(request: Request) -> tuple[int, int, int]:
    return request.queue_key


def _child_params(sampling: SamplingParams, index: int) -> SamplingParams:
    """Each sample runs with n=1; seeded samples get distinct, reproducible seeds."""
    if sampling.n == 1:
        return sampling
    seed = None if sampling.seed is None else (sampling.seed + index) % 2**63
    return replace(sampling, n=1, seed=seed)
