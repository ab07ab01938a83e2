"""Pooled requests in a step: taken out of sampling, their vectors made after the forward
pass.

A pooling request (SamplingParams.pooling) runs as a prefill. When the step computing its
last prompt token runs, the executor returns, instead of a sampled token:
- "last": the final-normed hidden state of that token;
- "mean": the mean of the final-normed hidden states of every prompt token. A prompt cut
  into chunks adds each chunk's rows to a running sum kept here by handle; the scheduler
  never gives such a request prefix-cache hits nor swaps it (their rows were never
  computed here), and a recomputed one starts again from position 0;
- with score_token_ids, the softmax over those tokens' next-token logits at the last
  position (a decoder reranker's "no"/"yes").
Normalising and truncating are the answer's business (shared/pooling/vectors.py).

The runner is checked here too, as the scheduler's peers are not trusted: on the pooling
runner a request that would sample fails, and on the generate runner a pooling request.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import torch

from folio.executor.input_batch import CachedRequest, StepInputs
from folio.shared.pooling.task import PoolingTask
from folio.shared.pooling.vectors import to_bytes
from folio.shared.protocol.step import NewRequest, StepResult


@dataclass
class PoolingStep:
    inputs: StepInputs                                   # without the pooled requests' rows
    sums: list[tuple[CachedRequest, int, int]]           # mean: (request, first row, rows)
    ends: list[tuple[CachedRequest, int]]                # prompt done: (request, last row)


class Pooler:
    def __init__(self, task: PoolingTask | None) -> None:
        self.task = task
        # Requests this step must look at: every pooling request, and on the pooling runner
        # every request (one that would sample fails). Empty: the step is untouched.
        self.watched: dict[int, CachedRequest] = {}
        self.sums: dict[int, torch.Tensor] = {}   # "mean": hidden-state sums by handle

    def admit(self, new_requests: list[NewRequest], batch_requests: dict) -> None:
        for new in new_requests:
            if new.sampling.pooling is not None or self.task is not None:
                self.watched[new.handle] = batch_requests[new.handle]

    def forget(self, handles: list[int]) -> None:
        for handle in handles:
            self.watched.pop(handle, None)
            self.sums.pop(handle, None)

    def split(self, scheduled: list[tuple[CachedRequest, int]], inputs: StepInputs,
              result: StepResult) -> PoolingStep | None:
        """Take this step's pooled and refused requests out of its sampling; None when it
        has none (the common case costs one dict lookup per scheduled request)."""
        if not self.watched:
            return None
        sampled_rows = {id(r): i for i, r in enumerate(inputs.sampled)}
        step = PoolingStep(inputs, [], [])
        dropped: set[int] = set()
        start = 0
        for request, count in scheduled:
            first, start = start, start + count
            if request.handle not in self.watched:
                continue
            pooling = request.sampling.pooling
            ends = id(request) in sampled_rows
            problem = self._problem(request)
            if problem is None and pooling == "mean":
                begin = request.num_computed - count
                if begin == 0:
                    self.sums.pop(request.handle, None)
                elif request.handle not in self.sums:
                    problem = "mean pooling needs every prompt position computed here"
                if problem is None:
                    step.sums.append((request, first, count))
            if problem is not None:
                result.failed.append((request.handle, problem))
            elif ends:
                step.ends.append((request, start - 1))
            if ends:
                dropped.add(sampled_rows[id(request)])
                self.watched.pop(request.handle, None)
        if dropped:
            keep = [i for i in range(len(inputs.sampled)) if i not in dropped]
            step.inputs = replace(
                inputs, sampled=[inputs.sampled[i] for i in keep],
                logits_indices=inputs.logits_indices[torch.as_tensor(
                    keep, dtype=torch.long, device=inputs.logits_indices.device)],
                drafts=None if inputs.drafts is None else [inputs.drafts[i] for i in keep])
        return step

    def finish(self, step: PoolingStep, hidden: torch.Tensor, model, result: StepResult
               ) -> None:
        """The pooled vectors of the requests whose prompt ended this step."""
        for request, first, count in step.sums:
            rows = hidden[first:first + count].float().sum(dim=0)
            total = self.sums.get(request.handle)
            self.sums[request.handle] = rows if total is None else total + rows
        for request, last in step.ends:
            sampling = request.sampling
            if sampling.score_token_ids:
                logits = model.compute_logits(hidden[last:last + 1])[0]
                ids = torch.as_tensor(sampling.score_token_ids, device=logits.device)
                vector = torch.softmax(logits[ids].float(), dim=0)
            elif sampling.pooling == "mean":
                vector = self.sums.pop(request.handle) / request.prompt_len
            else:
                vector = hidden[last].float()
            result.pooled.append((request.handle, to_bytes(vector.cpu().numpy())))

    def _problem(self, request: CachedRequest) -> str | None:
        pooling = request.sampling.pooling
        if pooling is None:
            return ("this engine runs the pooling runner (embeddings, rerank, score); it "
                    "does not generate")
        if self.task is None:
            return "this engine runs the generate runner; it does not pool (embeddings, " \
                   "rerank, score)"
        if request.sampling.score_token_ids and not self.task.scores:
            return "this model embeds; it does not score"
        return None
