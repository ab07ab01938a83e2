"""The executor's persistent batch: what it remembers of each request between steps.

A request's tokens and sampling parameters arrive once; afterwards a step plan says only how
many tokens to compute and which blocks were appended. Sampled tokens are appended here, so
the next step's input ids never cross the wire.

Each live request owns a row of two persistent arrays, its token ids and its block table,
written only where a plan or a sampled token changes them. A step's inputs are then a few
vectorized gathers from those rows, not Python lists rebuilt token by token.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from folio.executor.ops import AttentionInputs
from folio.shared.sampling_params import SamplingParams
from folio.shared.protocol.step import StepPlan


class CachedRequest:
    __slots__ = ("handle", "row", "token_ids", "prompt_len", "num_computed", "block_ids",
                 "sampling", "cache_scope", "state_slot")

    def __init__(self, handle: int, row: int, token_ids: list[int], prompt_len: int,
                 num_computed: int, block_ids: list[int], sampling: SamplingParams,
                 cache_scope: str | None = None, state_slot: int = -1) -> None:
        self.handle = handle
        self.row = row                  # this request's row in the persistent arrays
        self.token_ids = token_ids
        self.prompt_len = prompt_len
        self.num_computed = num_computed
        self.block_ids = block_ids
        self.sampling = sampling
        self.cache_scope = cache_scope  # the client that sent it (suffix decoding's cache)
        self.state_slot = state_slot    # a hybrid's recurrent state slot (-1: none)


@dataclass
class StepInputs:
    input_ids: torch.Tensor
    positions: torch.Tensor
    attention: AttentionInputs
    logits_indices: torch.Tensor       # rows of the flattened batch whose next token we sample
    sampled: list[CachedRequest]       # the requests those rows belong to, in order
    # Prompt-logprob work: (request, first batch row, first prompt position scored, count).
    prompt_scoring: list[tuple[CachedRequest, int, int, int]]
    # With speculative drafts in the step: the draft tokens of each request of `sampled`
    # (empty lists for the others), whose rows all follow its verified row in
    # logits_indices; None when no request carries drafts.
    drafts: list[list[int]] | None = None


class _Rows:
    """Persistent per-request rows of token ids and block ids, grown on demand."""

    def __init__(self, rows: int, max_tokens: int, block_size: int) -> None:
        self.max_blocks = -(-max_tokens // block_size)
        # One column more than the context limit: the token sampled after the last position.
        self.tokens = np.zeros((rows, max_tokens + 1), dtype=np.int64)
        self.tables = np.zeros((rows, self.max_blocks), dtype=np.int32)
        self.free = list(range(rows - 1, -1, -1))

    def take(self) -> int:
        if not self.free:
            rows = len(self.tokens)
            self.tokens = np.concatenate([self.tokens, np.zeros_like(self.tokens)])
            self.tables = np.concatenate([self.tables, np.zeros_like(self.tables)])
            self.free = list(range(2 * rows - 1, rows - 1, -1))
        row = self.free.pop()
        self.tables[row] = 0   # no stale block ids of the row's last owner
        return row

    def give_back(self, row: int) -> None:
        self.free.append(row)


class InputBatch:
    def __init__(self, block_size: int, device: torch.device, max_model_len: int,
                 max_num_seqs: int) -> None:
        self.block_size = block_size
        self.device = device
        self.requests: dict[int, CachedRequest] = {}
        self.rows = _Rows(max_num_seqs, max_model_len, block_size)

    def apply(self, plan: StepPlan) -> list[tuple[CachedRequest, int]]:
        """Update the remembered state from a plan; return (request, tokens to compute)."""
        rows = self.rows
        for handle in plan.dropped_handles:
            request = self.requests.pop(handle, None)
            if request is not None:
                rows.give_back(request.row)
        scheduled: list[tuple[CachedRequest, int]] = []
        for new in plan.new_requests:
            row = rows.take()
            tokens = list(new.token_ids)
            request = CachedRequest(new.handle, row, tokens, new.prompt_len,
                                    new.num_computed_tokens, list(new.block_ids), new.sampling,
                                    new.cache_scope, new.state_slot)
            rows.tokens[row, :len(tokens)] = tokens
            rows.tables[row, :len(request.block_ids)] = request.block_ids
            self.requests[new.handle] = request
            scheduled.append((request, new.num_new_tokens))
        for handle, num_tokens in zip(plan.running_handles, plan.running_num_tokens):
            request = self.requests[handle]
            appended = plan.new_block_ids.get(handle)
            if appended:
                start = len(request.block_ids)
                request.block_ids.extend(appended)
                rows.tables[request.row, start:start + len(appended)] = appended
            scheduled.append((request, num_tokens))
        return scheduled

    def append_token(self, request: CachedRequest, token: int) -> None:
        """Remember a token the executor sampled: the request's next input."""
        self.rows.tokens[request.row, len(request.token_ids)] = token
        request.token_ids.append(token)

    def write_drafts(self, request: CachedRequest, drafts: list[int]) -> None:
        """Put draft tokens after the request's known tokens as the step's inputs (not
        appended: sampled tokens overwrite them)."""
        start = len(request.token_ids)
        self.rows.tokens[request.row, start:start + len(drafts)] = drafts

    def prepare(self, scheduled: list[tuple[CachedRequest, int]],
                drafts: dict[int, list[int]] | None = None) -> StepInputs:
        """`drafts`: speculative draft tokens by handle, written by write_drafts and
        counted in their request's scheduled tokens; each gets a logits row."""
        count = len(scheduled)
        row_of = np.empty(count, dtype=np.int64)
        begins = np.empty(count, dtype=np.int64)
        lengths = np.empty(count, dtype=np.int64)
        sampled: list[CachedRequest] = []
        sampled_at: list[int] = []
        scoring: list[tuple[CachedRequest, int, int, int]] = []
        max_blocks = 1
        start = 0
        for i, (request, num_tokens) in enumerate(scheduled):
            begin = request.num_computed
            end = begin + num_tokens
            row_of[i], begins[i], lengths[i] = request.row, begin, num_tokens
            max_blocks = max(max_blocks, len(request.block_ids))
            if request.sampling.prompt_logprobs is not None:
                # Logits at position p score prompt token p + 1.
                last = min(end, request.prompt_len - 1)
                if last > begin:
                    scoring.append((request, start, begin + 1, last - begin))
            start += num_tokens
            extra = drafts.get(request.handle) if drafts else None
            if extra:   # the verified row, then one row per draft
                request.num_computed = end - len(extra)
                sampled_at.extend(range(start - 1 - len(extra), start))
                sampled.append(request)
                continue
            request.num_computed = end
            if end == len(request.token_ids):
                sampled_at.append(start - 1)
                sampled.append(request)
        starts = np.zeros(count + 1, dtype=np.int64)
        np.cumsum(lengths, out=starts[1:])
        # Position of every flattened token: its request's begin plus its offset there.
        token_row = np.repeat(np.arange(count), lengths)
        positions = np.arange(starts[-1]) - np.repeat(starts[:-1] - begins, lengths)
        rows = self.rows
        request_rows = row_of[token_row]
        input_ids = rows.tokens[request_rows, positions]
        block_size = self.block_size
        slots = rows.tables[request_rows, positions // block_size].astype(np.int64) \
            * block_size + positions % block_size
        device = self.device
        attention = AttentionInputs(
            slot_mapping=to_device(slots, device),
            block_tables=to_device(np.ascontiguousarray(rows.tables[row_of, :max_blocks]), device),
            seq_lens=to_device((begins + lengths).astype(np.int32), device),
            query_start_loc=to_device(starts.astype(np.int32), device),
        )
        return StepInputs(
            input_ids=to_device(input_ids, device),
            positions=to_device(positions, device),
            attention=attention,
            logits_indices=to_device(np.asarray(sampled_at, dtype=np.int64), device),
            sampled=sampled,
            prompt_scoring=scoring,
            drafts=[drafts.get(r.handle, []) for r in sampled] if drafts else None,
        )


def to_device(array: np.ndarray, device: torch.device) -> torch.Tensor:
    """A step's host array as a tensor on `device` (on the CPU, the same memory)."""
    tensor = torch.from_numpy(array)
    return tensor if device.type == "cpu" else tensor.to(device, non_blocking=True)
