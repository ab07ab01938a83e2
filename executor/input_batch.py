"""The executor's persistent batch: what it remembers of each request between steps.

A request's tokens and sampling parameters arrive once; afterwards a step plan says only how
many tokens to compute and which blocks were appended. Sampled tokens are appended here, so
the next step's input ids never cross the wire.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from executor.ops import AttentionInputs
from shared.sampling_params import SamplingParams
from shared.step import StepPlan


class CachedRequest:
    __slots__ = ("handle", "token_ids", "prompt_len", "num_computed", "block_ids", "sampling")

    def __init__(self, handle: int, token_ids: list[int], prompt_len: int, num_computed: int,
                 block_ids: list[int], sampling: SamplingParams) -> None:
        self.handle = handle
        self.token_ids = token_ids
        self.prompt_len = prompt_len
        self.num_computed = num_computed
        self.block_ids = block_ids
        self.sampling = sampling


@dataclass
class StepInputs:
    input_ids: torch.Tensor
    positions: torch.Tensor
    attention: AttentionInputs
    logits_indices: torch.Tensor       # rows of the flattened batch whose next token we sample
    sampled: list[CachedRequest]       # the requests those rows belong to, in order
    # Prompt-logprob work: (request, first batch row, first prompt position scored, count).
    prompt_scoring: list[tuple[CachedRequest, int, int, int]]


class InputBatch:
    def __init__(self, block_size: int, device: torch.device) -> None:
        self.block_size = block_size
        self.device = device
        self.requests: dict[int, CachedRequest] = {}

    def apply(self, plan: StepPlan) -> list[tuple[CachedRequest, int]]:
        """Update the remembered state from a plan; return (request, tokens to compute)."""
        for handle in plan.finished_handles:
            self.requests.pop(handle, None)
        scheduled: list[tuple[CachedRequest, int]] = []
        for new in plan.new_requests:
            request = CachedRequest(new.handle, list(new.token_ids), new.prompt_len,
                                    new.num_computed_tokens, list(new.block_ids), new.sampling)
            self.requests[new.handle] = request
            scheduled.append((request, new.num_new_tokens))
        for handle, num_tokens in zip(plan.running_handles, plan.running_num_tokens):
            request = self.requests[handle]
            appended = plan.new_block_ids.get(handle)
            if appended:
                request.block_ids.extend(appended)
            scheduled.append((request, num_tokens))
        return scheduled

    def prepare(self, scheduled: list[tuple[CachedRequest, int]]) -> StepInputs:
        block_size = self.block_size
        input_ids: list[int] = []
        positions: list[int] = []
        slots: list[int] = []
        seq_lens: list[int] = []
        starts = [0]
        logits_indices: list[int] = []
        sampled: list[CachedRequest] = []
        scoring: list[tuple[CachedRequest, int, int, int]] = []
        max_blocks = max(len(r.block_ids) for r, _ in scheduled)
        tables: list[list[int]] = []
        for request, num_tokens in scheduled:
            begin = request.num_computed
            end = begin + num_tokens
            input_ids.extend(request.token_ids[begin:end])
            span = range(begin, end)
            positions.extend(span)
            blocks = request.block_ids
            slots.extend(blocks[p // block_size] * block_size + p % block_size for p in span)
            seq_lens.append(end)
            starts.append(starts[-1] + num_tokens)
            tables.append(blocks + [0] * (max_blocks - len(blocks)))
            if request.sampling.prompt_logprobs is not None:
                # Logits at position p score prompt token p + 1.
                last = min(end, request.prompt_len - 1)
                if last > begin:
                    scoring.append((request, starts[-2], begin + 1, last - begin))
            request.num_computed = end
            if end == len(request.token_ids):
                logits_indices.append(starts[-1] - 1)
                sampled.append(request)
        device = self.device
        attention = AttentionInputs(
            slot_mapping=torch.tensor(slots, dtype=torch.long, device=device),
            block_tables=torch.tensor(tables, dtype=torch.int32, device=device),
            seq_lens=torch.tensor(seq_lens, dtype=torch.int32, device=device),
            query_start_loc=torch.tensor(starts, dtype=torch.int32, device=device),
        )
        return StepInputs(
            input_ids=torch.tensor(input_ids, dtype=torch.long, device=device),
            positions=torch.tensor(positions, dtype=torch.long, device=device),
            attention=attention,
            logits_indices=torch.tensor(logits_indices, dtype=torch.long, device=device),
            sampled=sampled,
            prompt_scoring=scoring,
        )
