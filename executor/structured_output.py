"""Token masks for structured outputs, kept where the sampled tokens are known.

With one step in flight the scheduler plans step N+1 before it has seen step N's tokens,
but the executor samples them and feeds them back itself; so the grammar matchers live
here and advance on the executor's own tokens, and a mask is always computed from every
token before it (vLLM instead keeps them in the engine core and sends a bitmask after
the forward of the step has started: docs/protocol.md, "Structured outputs").

Per step the work runs on one worker thread while the forward pass runs: first the
matchers of new requests are made (a grammar is compiled once per distinct spec and
copied per request; a recomputed request replays its earlier output), then each matcher
consumes the tokens sampled last step, then the masks of this step's constrained rows
are filled. The sampler waits for that at the end of the forward pass; rows without a
grammar are never touched.

Each request's grammar has a budget (shared/structured_output.py GrammarBudget): the
matchers run under llguidance's limits, and each row's mask is timed in CPU time. A
matcher that errs (a limit passed, an empty language) or whose masks cost more than the
budget per token on average fails that request alone (`take_failed`): the executor ends
it with an error, and the rest of the batch never waits on it again.
"""

from __future__ import annotations

import json
import logging
import time
from collections import OrderedDict
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import Any

import torch

from folio.executor.input_batch import CachedRequest
from folio.shared.protocol.step import StepPlan
from folio.shared.structured_output import GrammarBudget, matcher_error, parser_limits, to_grammar

log = logging.getLogger("folio.executor")
MAX_COMPILED = 256   # distinct specs kept compiled; the oldest is dropped past this
BUDGET_AFTER = 4     # masks timed before a request's mean cost is held to the budget


class GrammarMasks:
    def __init__(self, model_dir: str, vocab_size: int, eos_token_ids: tuple[int, ...],
                 budget: GrammarBudget = GrammarBudget()) -> None:
        self.model_dir = model_dir
        self.budget = budget
        self.vocab_size = vocab_size
        self.eos_token_ids = eos_token_ids
        self.words = (vocab_size + 31) // 32
        self._tokenizer: Any = None
        self._compiled: OrderedDict[str, Any] = OrderedDict()
        self._matchers: dict[int, Any] = {}
        self._new: dict[int, tuple[dict[str, Any], list[int]]] = {}   # handle -> spec, replay
        self._sampled: dict[int, list[int]] = {}                      # not yet consumed
        self._pool: ThreadPoolExecutor | None = None
        self._limits: Any = None
        self._cost: dict[int, tuple[int, float]] = {}   # handle -> masks timed, CPU seconds
        self._failed: dict[int, str] = {}               # handle -> why, until taken

    @property
    def active(self) -> bool:
        return bool(self._matchers or self._new)

    def apply(self, plan: StepPlan) -> None:
        """Track the plan's request changes (before the batch forgets finished ones)."""
        for handle in plan.dropped_handles:
            self._forget(handle)
        for new in plan.new_requests:
            self._forget(new.handle)   # a handle may be reused, or a request recomputed
            spec = new.sampling.structured_output
            if spec is not None:
                self._new[new.handle] = (spec, list(new.token_ids[new.prompt_len:]))

    def start(self, sampled: list[CachedRequest], drafts: list[list[int]] | None = None
              ) -> Future | None:
        """Begin this step's masks for the constrained rows of `sampled`, on the worker.
        `drafts` (speculative decoding, aligned with `sampled`): a request's logits rows
        are then its verified one and one per draft, each masked as if the drafts before
        it had been sampled, and the masks' rows count every request's rows."""
        if not self.active:
            return None
        rows = [i for i, r in enumerate(sampled)
                if r.handle in self._matchers or r.handle in self._new]
        if self._pool is None:
            self._pool = ThreadPoolExecutor(1, thread_name_prefix="folio-grammar")
        handles = [sampled[i].handle for i in rows]
        if drafts is None:
            return self._pool.submit(self._masks, rows, handles)
        first, offset = [], 0
        for proposed in drafts:
            first.append(offset)
            offset += 1 + len(proposed)
        return self._pool.submit(self._masks, [first[i] for i in rows], handles,
                                 [drafts[i] for i in rows])

    def take_failed(self, sampled: list[CachedRequest]) -> dict[int, str]:
        """Rows of `sampled` whose grammar failed in the last `start` (after its result),
        with the reason; each is reported once, and its matcher is not used again."""
        if not self._failed:
            return {}
        failed = {i: self._failed.pop(r.handle) for i, r in enumerate(sampled)
                  if r.handle in self._failed}
        for row in failed:
            self._matchers[sampled[row].handle] = None
        return failed

    def accepted(self, requests: list[CachedRequest], tokens: list[int]) -> None:
        """Tokens just sampled; the matchers consume them at the start of the next step."""
        for request, token in zip(requests, tokens):
            queue = self._sampled.get(request.handle)
            if queue is not None:
                queue.append(token)

    def close(self) -> None:
        if self._pool is not None:
            self._pool.shutdown(wait=True)

    # ---- on the worker thread -------------------------------------------------------------

    def _masks(self, rows: list[int], handles: list[int],
               drafts: list[list[int]] | None = None
               ) -> tuple[list[int], torch.Tensor] | None:
        for handle, (spec, replay) in list(self._new.items()):
            try:
                matcher = self._compile(spec).deep_copy()
            except Exception as error:   # a spec the frontend let through: end the request
                log.warning("grammar of request %d does not compile here: %s", handle, error)
                matcher = None
            if matcher is not None and replay:
                matcher.consume_tokens(replay)
            self._matchers[handle] = matcher
            self._sampled[handle] = []
            del self._new[handle]
        for handle, tokens in self._sampled.items():
            if tokens:
                matcher = self._matchers[handle]
                if matcher is not None and not matcher.is_stopped():   # stopped: thrown away
                    matcher.consume_tokens(tokens)
                tokens.clear()
        if not rows:
            return None
        if drafts is not None:
            rows, handles, drafts = _draft_rows(rows, handles, drafts)
        mask = torch.zeros((len(rows), self.words), dtype=torch.int32)
        stride = self.words * 4
        for k, handle in enumerate(handles):
            matcher = self._matchers[handle]
            if matcher is None:
                continue
            # A draft row: the drafts before it consumed (rolled back after its mask). One
            # the grammar refuses leaves the rows after it empty: its own row's mask bans
            # it, so it is rejected and they are never read.
            before = drafts[k] if drafts is not None else ()
            if before:
                consumed = matcher.try_consume_tokens(list(before))
                if consumed < len(before):
                    if consumed:
                        matcher.rollback(consumed)
                    continue
            # One row at a time, timed in this thread's CPU time (a loaded machine does
            # not count against a request); llguidance drops the GIL meanwhile.
            start = time.thread_time()
            matcher.unsafe_compute_mask_ptr(mask.data_ptr() + k * stride, stride)
            self._charge(handle, matcher, time.thread_time() - start)
            if before:
                matcher.rollback(len(before))
        empty = ~(mask != 0).any(dim=1)
        if bool(empty.any()):
            # No matcher, or one with no token left: only end-of-sequence is allowed, so
            # the request ends instead of running free (and fails, when its grammar did).
            for k in torch.nonzero(empty).flatten().tolist():
                matcher = self._matchers[handles[k]]
                if matcher is None and handles[k] not in self._failed:
                    self._failed[handles[k]] = ("structured output: the grammar does not "
                                                "compile on the executor")
                for eos in self.eos_token_ids:
                    mask[k, eos // 32] |= _bit(eos % 32)
        return rows, mask

    def _charge(self, handle: int, matcher: Any, seconds: float) -> None:
        """Fail the request whose matcher erred or whose masks cost past the budget."""
        if matcher.is_error():
            reason = "structured output: " + matcher_error(matcher.get_error())
        elif handle not in self._cost:   # the first mask builds the lexer: not charged
            self._cost[handle] = (0, 0.0)
            return
        else:
            count, total = self._cost[handle]
            count, total = count + 1, total + seconds
            self._cost[handle] = (count, total)
            mean_ms = total / count * 1e3
            if count < BUDGET_AFTER or mean_ms <= self.budget.max_mask_ms:
                return
            reason = (f"structured output: the grammar costs {mean_ms:.1f} ms of CPU per "
                      f"token, over the budget of {self.budget.max_mask_ms:g} ms")
        log.warning("request %d fails: %s", handle, reason)
        self._failed[handle] = reason

    def _compile(self, spec: dict[str, Any]) -> Any:
        import llguidance

        key = json.dumps(spec, sort_keys=True)
        matcher = self._compiled.get(key)
        if matcher is not None:
            self._compiled.move_to_end(key)
            return matcher
        if self._tokenizer is None:
            self._tokenizer = _ll_tokenizer(self.model_dir, self.vocab_size,
                                            self.eos_token_ids)
            self._limits = parser_limits(self.budget)
        matcher = llguidance.LLMatcher(self._tokenizer, to_grammar(spec), log_level=0,
                                       limits=self._limits)
        self._compiled[key] = matcher
        if len(self._compiled) > MAX_COMPILED:
            self._compiled.popitem(last=False)
        return matcher

    def _forget(self, handle: int) -> None:
        self._matchers.pop(handle, None)
        self._cost.pop(handle, None)
        self._failed.pop(handle, None)
        self._new.pop(handle, None)
        self._sampled.pop(handle, None)


def _draft_rows(rows: list[int], handles: list[int], drafts: list[list[int]]
                ) -> tuple[list[int], list[int], list[list[int]]]:
    """One mask row per logits row of each constrained request: its verified row, then
    one per draft, each with the drafts before it."""
    out_rows, out_handles, before = [], [], []
    for row, handle, proposed in zip(rows, handles, drafts):
        for j in range(len(proposed) + 1):
            out_rows.append(row + j)
            out_handles.append(handle)
            before.append(proposed[:j])
    return out_rows, out_handles, before


def _bit(index: int) -> int:
    """Bit `index` of an int32 word, as a Python int that fits int32 (bit 31 is negative)."""
    return -(1 << 31) if index == 31 else 1 << index


def _ll_tokenizer(model_dir: str, vocab_size: int, eos_token_ids: tuple[int, ...]) -> Any:
    """llguidance's view of the checkpoint's tokenizer: its tokenizer.json read directly
    (no transformers import in the executor), else through transformers (a GGUF file's
    tokenizer is in its metadata)."""
    import llguidance

    path = Path(model_dir) / "tokenizer.json"
    eos = list(eos_token_ids) or None
    if path.is_file():
        return llguidance.LLTokenizer(str(path), n_vocab=vocab_size, eos_token=eos)
    import llguidance.hf

    from folio.shared.hf_tokenizer import load_tokenizer

    return llguidance.hf.from_tokenizer(load_tokenizer(model_dir), n_vocab=vocab_size,
                                        eos_token=eos)


def apply_masks(logits: torch.Tensor, rows: list[int], mask: torch.Tensor) -> torch.Tensor:
    """-inf, in place, on every token a row's bitmask (32 tokens per int32 word) does not
    allow. index_select / index_copy_, not `logits[index]`: on a loaded CPU the advanced
    indexing kernel took 20-30 ms for a 4 x 1024 batch, these a few microseconds."""
    vocab = logits.shape[1]
    shifts = torch.arange(32, dtype=torch.int32)
    allowed = ((mask[:, :, None] >> shifts) & 1).bool().reshape(len(rows), -1)
    if allowed.shape[1] < vocab:   # logits padded past the tokenizer: never allowed
        allowed = torch.nn.functional.pad(allowed, (0, vocab - allowed.shape[1]))
    banned = ~allowed[:, :vocab].to(logits.device, non_blocking=True)
    if rows == list(range(logits.shape[0])):
        return logits.masked_fill_(banned, float("-inf"))
    index = torch.tensor(rows, dtype=torch.long, device=logits.device)
    return logits.index_copy_(0, index, logits.index_select(0, index).masked_fill_(
        banned, float("-inf")))
