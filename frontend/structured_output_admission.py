"""Structured-output grammars admitted off the event loop, within a budget.

Compiling a grammar takes from under a millisecond to seconds: a 128-tool schema took
0.3 s to convert and build, `a{100000}` half a second for its first token mask and then
25-50 ms for every token after it (on the executor's one grammar thread, inside every
step). So a request's spec is admitted here, once per distinct spec (the verdict is
cached), on a small thread pool, never on the event loop:

  1. its shape and size were checked on the loop (frontend/openai/structured_output.py);
  2. it compiles under llguidance's limits (shared/structured_output.py GrammarBudget);
  3. a matcher on the served tokenizer computes its first mask: none means an empty
     language (`[^\\s\\S]`) or a `$ref` cycle, which would answer "" as if it were valid;
  4. a short walk (the middle allowed token each time) measures the per-token mask cost
     in this thread's CPU time, so a loaded machine does not count against a request.

Past any of them the request is refused, and the caller answers 400 naming the field.
The executor holds every request to the same budget while it runs (executor/structured_output.py).
llguidance drops the GIL while it builds matchers and masks; converting a JSON schema
holds it, for at most a few tens of milliseconds at the size limit.
"""

from __future__ import annotations

import asyncio
import json
import logging
import threading
import time
from collections import OrderedDict
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

from folio.shared.structured_output import (GrammarBudget, checked_grammar, matcher_error,
                                      parser_limits)

log = logging.getLogger("folio.frontend")


@dataclass(frozen=True)
class AdmissionConfig:
    workers: int = 1          # grammar work at once; the rest waits without blocking the loop
    cached: int = 256         # verdicts kept, by spec
    budget: GrammarBudget = GrammarBudget()


class GrammarAdmission:
    def __init__(self, tokenizer: Any, config: AdmissionConfig = AdmissionConfig()) -> None:
        self.hf_tokenizer = tokenizer
        self.config = config
        self.pool = ThreadPoolExecutor(config.workers, thread_name_prefix="folio-grammar")
        self.verdicts: OrderedDict[str, str | None] = OrderedDict()
        self.running: dict[str, asyncio.Future] = {}   # the same spec admitted once at a time
        self._ll_tokenizer: Any = None
        self._tokenizer_lock = threading.Lock()

    async def check(self, specs: list[dict[str, Any]], walk: bool = True) -> str | None:
        """Why these specs cannot be served (the first that cannot), or None. `walk`:
        measure the masks too (the spec is enforced), not only that it compiles."""
        key = json.dumps([specs, walk], sort_keys=True)
        if key in self.verdicts:
            self.verdicts.move_to_end(key)
            return self.verdicts[key]
        running = self.running.get(key)
        if running is None:
            running = asyncio.wrap_future(self.pool.submit(self.verdict, specs, walk))
            self.running[key] = running
            running.add_done_callback(lambda done: self._remember(key, done))
        # Shielded: a client that leaves does not cancel the work others wait for.
        return await asyncio.shield(running)

    def _remember(self, key: str, done: asyncio.Future) -> None:
        del self.running[key]
        if not done.cancelled() and done.exception() is None:
            self.verdicts[key] = done.result()
            if len(self.verdicts) > self.config.cached:
                self.verdicts.popitem(last=False)

    def close(self) -> None:
        self.pool.shutdown(wait=False, cancel_futures=True)

    # ---- in the pool ----------------------------------------------------------------------

    def verdict(self, specs: list[dict[str, Any]], walk: bool) -> str | None:
        for spec in specs:
            try:
                error = self._one(spec, walk)
            except Exception as error:   # llguidance raises several types for bad input
                return f"cannot be compiled: {error}"
            if error is not None:
                return error
        return None

    def _one(self, spec: dict[str, Any], walk: bool) -> str | None:
        from llguidance import LLMatcher

        budget = self.config.budget
        start = time.thread_time()
        grammar, error = checked_grammar(spec, budget)
        if error is not None:
            return "cannot be compiled: " + " ".join(error.split())[:500]
        tokenizer = self._tokenizer() if walk else None
        if tokenizer is None:
            return None
        matcher = LLMatcher(tokenizer, grammar, log_level=0, limits=parser_limits(budget))
        spent_ms = (time.thread_time() - start) * 1e3
        if matcher.is_error():
            return "cannot be compiled: " + matcher_error(matcher.get_error())
        if spent_ms > budget.max_compile_ms:
            return (f"the grammar is too costly to compile: {spent_ms:.0f} ms of CPU, "
                    f"over the budget of {budget.max_compile_ms:g} ms")
        return _walk(matcher, tokenizer.eos_token, budget)

    def _tokenizer(self) -> Any:
        """llguidance's view of the served tokenizer, built on first use (a large
        vocabulary takes a while); None when it cannot be built (then only compiling is
        checked here, and the executor's budget still holds)."""
        with self._tokenizer_lock:
            if self._ll_tokenizer is None:
                try:
                    import llguidance.hf

                    self._ll_tokenizer = llguidance.hf.from_tokenizer(self.hf_tokenizer)
                except Exception as error:   # e.g. a slow (Python) tokenizer
                    log.warning("grammar costs are not measured at admission: %s", error)
                    self._ll_tokenizer = False
            return self._ll_tokenizer or None


def _walk(matcher: Any, eos: int, budget: GrammarBudget) -> str | None:
    """Refusal reason from the first mask and a short walk's per-token cost, or None."""
    import numpy as np

    costs: list[float] = []
    for step in range(budget.walk_tokens + 1):
        start = time.thread_time()
        bits = matcher.compute_bitmask()
        cost_ms = (time.thread_time() - start) * 1e3
        if matcher.is_error():
            return matcher_error(matcher.get_error())
        if step == 0:
            if cost_ms > budget.max_first_mask_ms:
                return (f"the grammar is too costly: its first token mask took "
                        f"{cost_ms:.0f} ms of CPU, over the budget of "
                        f"{budget.max_first_mask_ms:g} ms")
        else:
            costs.append(cost_ms)
            if sum(costs) > budget.max_mask_ms * budget.walk_tokens:
                break   # the mean is past the budget whatever comes next
        allowed = np.flatnonzero(np.unpackbits(np.frombuffer(bits, np.uint8),
                                               bitorder="little"))
        allowed = allowed[allowed != eos]
        if not len(allowed):
            break   # only the end is left: a short language, nothing more to measure
        matcher.consume_token(int(allowed[len(allowed) // 2]))
    mean_ms = sum(costs) / len(costs) if costs else 0.0
    if mean_ms > budget.max_mask_ms:
        return (f"the grammar is too costly: its token masks take {mean_ms:.1f} ms of CPU "
                f"per token, over the budget of {budget.max_mask_ms:g} ms (a counted "
                "repetition such as {100000} is the usual cause)")
    return None
