"""The executor's half of multi-step decoding (docs/multi_step.md).

With `--num-scheduler-steps K` the scheduler gives a small decode batch's rows a cap of
K - 1 (StepPlan.drafts, the field speculation uses: the scheduler reserves their KV slots
and counts the extra tokens exactly as accepted drafts). After the plan's own pass, each
capped row runs up to that many more one-token passes here, each feeding the token just
sampled back in, with the same code as any step (`run_pass`: sampling, grammar masks,
logprobs, LoRA, a hybrid's states). A row stops early at a token that ends it (a stop id
once min_tokens are out) or a failure; the scheduler ends it at its length limits, which
the caps never pass. The result lists each request's tokens in order, and `drafts` says
how many extra tokens each row got, as `accepted`.
"""

from __future__ import annotations

from collections.abc import Callable

from folio.executor.input_batch import CachedRequest, InputBatch
from folio.shared.protocol.step import StepResult


def run_burst(run_pass: Callable, batch: InputBatch, eos_token_ids: tuple[int, ...],
              caps: dict[int, int], result: StepResult) -> int:
    """Run the burst's extra passes after the plan's pass, whose tokens `result` holds;
    add their tokens to `result`; return the tokens computed."""
    left: dict[int, int] = {}
    active: list[CachedRequest] = []
    for handle in result.handles:
        request = batch.requests[handle]
        cap = caps.get(handle, 0)
        left[handle] = 0
        if cap > 0 and not _ends(request, eos_token_ids):
            left[handle] = cap
            active.append(request)
    produced = dict.fromkeys(left, 0)
    logprobs = _aligned(result)
    computed = 0
    while active:
        step = StepResult(step_id=result.step_id)
        run_pass([(request, 1) for request in active], {}, {}, step)
        computed += len(active)
        result.handles += step.handles
        result.token_ids += step.token_ids
        logprobs += _aligned(step)
        result.failed += step.failed
        for handle in step.handles:
            produced[handle] += 1
        failed = {handle for handle, _ in step.failed}
        for request in active:
            left[request.handle] -= 1
        active = [request for request in active
                  if left[request.handle] > 0 and request.handle not in failed
                  and not _ends(request, eos_token_ids)]
    result.logprobs = logprobs if any(entry is not None for entry in logprobs) else []
    result.drafts = [(handle, caps[handle], produced[handle])
                     for handle in produced if caps.get(handle, 0) > 0]
    return computed


def _ends(request: CachedRequest, eos_token_ids: tuple[int, ...]) -> bool:
    """Whether the request's last token ends it (the scheduler's rule for stop ids)."""
    sampling = request.sampling
    token = request.token_ids[-1]
    if len(request.token_ids) - request.prompt_len <= sampling.min_tokens:
        return False
    return token in sampling.stop_token_ids or (
        not sampling.ignore_eos and token in eos_token_ids)


def _aligned(result: StepResult) -> list:
    """The result's logprob entries, one per token (None where none was asked)."""
    return list(result.logprobs) if result.logprobs else [None] * len(result.handles)
