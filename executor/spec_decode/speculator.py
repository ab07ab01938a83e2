"""Speculative decoding on the executor (docs/spec_decode.md): propose drafts from each
request's own tokens before the forward pass, verify them after it.

The scheduler sends a cap per request (StepPlan.drafts); the executor proposes up to that
many tokens by n-gram prompt lookup or suffix decoding (executor/spec_decode/suffix.py) over
the tokens it holds (prompt and verified output, the last step's included: one step in
flight stays exact). A request's step then computes
its verified token plus the drafts as one chunk, with a logits row each.

Verification treats every row as the decode row it would be had the drafts before it been
sampled: the sampler's processing (masks, bias, min_tokens, penalties over the tokens
before it) sees the request's tokens plus those drafts. Greedy rows accept a draft while it
equals the argmax; sampled rows use rejection sampling with a one-hot proposal, so the
output distribution is the model's (executor/spec_decode/rejection_sampler.py).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import torch

from folio.executor.input_batch import CachedRequest, InputBatch, StepInputs
from folio.executor.spec_decode.rejection_sampler import verify_sampled
from folio.executor.sampler import Sampler, TokenLogprobs
from folio.executor.spec_decode.suffix import SuffixCache, SuffixSettings, propose_suffix
from folio.shared.spec_decode_config import SpeculativeConfig
from folio.shared.protocol.step import StepResult


def propose_ngram(tokens: np.ndarray, max_drafts: int, lookup_min: int, lookup_max: int
                  ) -> list[int]:
    """Up to `max_drafts` tokens that followed the latest earlier occurrence of the last n
    tokens, n from lookup_max down to lookup_min; [] when none recurs."""
    length = len(tokens)
    for n in range(min(lookup_max, length - 1), lookup_min - 1, -1):
        # Candidate starts i < length - n: the suffix itself is not a match.
        starts = length - n
        match = tokens[:starts] == tokens[starts]
        for j in range(1, n):
            match &= tokens[j:starts + j] == tokens[starts + j]
        found = np.flatnonzero(match)
        if len(found):
            begin = int(found[-1]) + n
            return tokens[begin:begin + max_drafts].tolist()
    return []


class _Extended(Sequence):
    """A request's token ids followed by some drafts, without copying the ids (the sampler
    mostly asks the length; penalties read them all)."""

    __slots__ = ("base", "extra")

    def __init__(self, base: list[int], extra: list[int]) -> None:
        self.base = base
        self.extra = extra

    def __len__(self) -> int:
        return len(self.base) + len(self.extra)

    def __getitem__(self, index):
        if isinstance(index, slice):
            return (self.base + self.extra)[index]
        if index < 0:
            index += len(self)
        size = len(self.base)
        return self.base[index] if index < size else self.extra[index - size]


class _DraftRow:
    """A request as one of its draft rows sees it: its tokens with the drafts before the
    row appended (what the sampler reads: token ids, prompt length, parameters)."""

    __slots__ = ("handle", "token_ids", "prompt_len", "sampling")

    def __init__(self, request: CachedRequest, drafts: list[int]) -> None:
        self.handle = request.handle
        # Penalties read every id (as a tensor): a real list for them.
        self.token_ids = request.token_ids + drafts if request.sampling.needs_penalties() \
            else _Extended(request.token_ids, drafts)
        self.prompt_len = request.prompt_len
        self.sampling = request.sampling


@dataclass
class _Outcome:
    tokens: list[int]
    logprobs: list[TokenLogprobs | None]
    accepted: int
    failed: str | None = None


class Speculator:
    def __init__(self, config: SpeculativeConfig, max_model_len: int) -> None:
        self.config = config
        self.max_model_len = max_model_len
        self.suffix = SuffixSettings(config.suffix_decoding_max_tree_depth,
                                     config.suffix_decoding_max_spec_factor,
                                     config.suffix_decoding_min_token_prob,
                                     config.suffix_decoding_min_match_len)
        # Suffix decoding's global cache: outputs of the last finished requests (opt-in).
        self.cache = SuffixCache(config.suffix_decoding_max_cached_requests) \
            if config.method == "suffix" and config.suffix_decoding_max_cached_requests \
            else None

    def retire(self, request: CachedRequest | None) -> None:
        """A request the executor forgets (finished, aborted or preempted): its output joins
        the global cache. A preempted one may come back and join again, a repeat that only
        weighs its continuations a little more."""
        if self.cache is not None and request is not None:
            self.cache.add(request.token_ids[request.prompt_len:], self._scope(request))

    def _scope(self, request: CachedRequest) -> str | None:
        """Whose cached outputs the request reads and joins: its client's, unless the
        config shares them (suffix_decoding_cache_scope)."""
        if self.config.suffix_decoding_cache_scope == "shared":
            return None
        return request.cache_scope

    def _propose(self, tokens: np.ndarray, cap: int, request: CachedRequest) -> list[int]:
        config = self.config
        if config.method == "suffix":
            return propose_suffix(tokens, cap, self.suffix, self.cache, self._scope(request))
        return propose_ngram(tokens, cap, config.prompt_lookup_min, config.prompt_lookup_max)

    def propose(self, scheduled: list[tuple[CachedRequest, int]], caps: dict[int, int],
                batch: InputBatch) -> dict[int, list[int]]:
        """Drafts for the requests the plan allows them (their scheduled count grows by
        the drafts found), written into the batch's rows; by handle."""
        drafts: dict[int, list[int]] = {}
        for index, (request, num_tokens) in enumerate(scheduled):
            cap = caps.get(request.handle)
            if not cap or not self._may_draft(request, num_tokens):
                continue
            # Positions stay inside the context (the scheduler's cap says so too).
            cap = min(cap, self.max_model_len - len(request.token_ids))
            if cap <= 0:
                continue
            tokens = batch.rows.tokens[request.row, :len(request.token_ids)]
            found = self._propose(tokens, cap, request)
            if found:
                batch.write_drafts(request, found)
                scheduled[index] = (request, num_tokens + len(found))
                drafts[request.handle] = found
        return drafts

    @staticmethod
    def _may_draft(request: CachedRequest, num_tokens: int) -> bool:
        """A decode step (the one verified token left), of a request whose every row the
        verification handles (prompt logprobs run without drafts)."""
        sampling = request.sampling
        return (num_tokens == 1 and len(request.token_ids) - request.num_computed == 1
                and sampling.speculative and sampling.prompt_logprobs is None)

    def finish_step(self, sampler: Sampler, batch: InputBatch, inputs: StepInputs,
                    logits: torch.Tensor, masks, failed_grammar: dict[int, str],
                    result: StepResult) -> list[tuple[CachedRequest, int]]:
        """Verify a step with drafts: append each request's tokens to the batch, fill the
        result's tokens, logprobs, failures and draft counts. Returns (request, token)
        pairs in order, for the grammar matchers."""
        outcomes = verify(sampler, logits, inputs.sampled, inputs.drafts, masks)
        handles: list[int] = []
        tokens: list[int] = []
        logprobs: list[TokenLogprobs | None] = []
        accepted_pairs: list[tuple[CachedRequest, int]] = []
        for index, (request, outcome, drafts) in enumerate(
                zip(inputs.sampled, outcomes, inputs.drafts)):
            why = failed_grammar.get(index) or outcome.failed
            if why is not None:   # this request alone ends; its placeholder is kept
                batch.append_token(request, outcome.tokens[0])
                result.failed.append((request.handle, why))
                continue
            for token in outcome.tokens:
                batch.append_token(request, token)
                accepted_pairs.append((request, token))
            request.num_computed += outcome.accepted   # their KV is the step's
            handles += [request.handle] * len(outcome.tokens)
            tokens += outcome.tokens
            logprobs += outcome.logprobs
            if drafts:
                result.drafts.append((request.handle, len(drafts), outcome.accepted))
        result.handles, result.token_ids = handles, tokens
        if any(entry is not None for entry in logprobs):
            result.logprobs = [None if e is None else
                               (e.logprob, e.rank, e.top_ids, e.top_logprobs)
                               for e in logprobs]
        return accepted_pairs


def verify(sampler: Sampler, logits: torch.Tensor, requests: list[CachedRequest],
           drafts: list[list[int]], masks) -> list[_Outcome]:
    """Each request's tokens from its logits rows (one, or one per draft plus one).
    `masks`: the grammar's, one row per logits row of a constrained request (a draft the
    grammar refuses is banned at its own row, so it is never accepted)."""
    rows: list[CachedRequest | _DraftRow] = []
    first_row: list[int] = []
    for request, proposed in zip(requests, drafts):
        first_row.append(len(rows))
        rows.append(request)
        rows.extend(_DraftRow(request, proposed[:j]) for j in range(1, len(proposed) + 1))
    # Every row as an ordinary decode row: its own token, logprobs and failure.
    plain = sampler.sample(logits, rows, masks)
    outcomes: list[_Outcome] = []
    sampled_drafts: list[int] = []
    for i, (request, proposed) in enumerate(zip(requests, drafts)):
        first = first_row[i]
        if not proposed:
            outcomes.append(_Outcome([plain.tokens[first]], [plain.logprobs[first]], 0,
                                     plain.failed.get(first)))
            continue
        if not request.sampling.greedy and request.sampling.seed is None:
            sampled_drafts.append(i)
            outcomes.append(_Outcome([], [], 0))
            continue
        # Greedy, or seeded: each row's own draw (a seeded row's from its (seed, output
        # position) stream) is the token that position gets with or without drafts; a draft
        # is accepted when it is that token. For a seeded row this is still exact sampling
        # (the draw has the row's distribution; a one-hot draft is accepted with p(draft)),
        # and the text is the same whatever the load and whether drafts were made.
        accepted = 0
        while accepted < len(proposed) and proposed[accepted] == plain.tokens[first + accepted]:
            accepted += 1
        last = first + accepted
        failed = next((plain.failed[r] for r in range(first, last + 1) if r in plain.failed),
                      None)
        outcomes.append(_Outcome(plain.tokens[first:last + 1], plain.logprobs[first:last + 1],
                                 accepted, failed))
    if sampled_drafts:
        _verify_sampled(sampler, logits, rows, first_row, requests, drafts, plain,
                        sampled_drafts, outcomes, masks)
    return outcomes


def _verify_sampled(sampler: Sampler, logits: torch.Tensor, rows: list, first_row: list[int],
                    requests: list[CachedRequest], drafts: list[list[int]], plain,
                    indices: list[int], outcomes: list[_Outcome], masks=None) -> None:
    """Rejection sampling for the sampled (non-greedy) requests with drafts, in one pass:
    their rows' distributions together, then the accept tests and residual draws."""
    span_rows: list[int] = []
    spans: list[tuple[int, list[int]]] = []
    for i in indices:
        spans.append((len(span_rows), drafts[i]))
        span_rows.extend(range(first_row[i], first_row[i] + len(drafts[i]) + 1))
    views = [rows[r] for r in span_rows]
    index = torch.tensor(span_rows, dtype=torch.long, device=logits.device)
    raw = logits.index_select(0, index)
    probs = sampler.probabilities(sampler.processed(raw, views, _sub_masks(masks, span_rows)),
                                  views)
    answers = verify_sampled(probs, spans, [requests[i] for i in indices], sampler)
    chosen_rows: list[int] = []
    chosen_tokens: list[int] = []
    for i, (start, proposed), (accepted, token) in zip(indices, spans, answers):
        last = first_row[i] + accepted
        if token is None:   # every draft accepted: the ordinary draw at the last row
            token = plain.tokens[last]
        tokens = proposed[:accepted] + [token]
        chosen_rows.extend(range(start, start + accepted + 1))
        chosen_tokens.extend(tokens)
        failed = next((plain.failed[r] for r in range(first_row[i], last + 1)
                       if r in plain.failed), None)
        outcomes[i] = _Outcome(tokens, [], accepted, failed)
    # Logprobs of the returned tokens under their rows' raw logits (rows that ask).
    pick = torch.tensor(chosen_rows, dtype=torch.long, device=logits.device)
    entries = iter(sampler.logprobs_of(raw.index_select(0, pick), chosen_tokens,
                                       [views[r] for r in chosen_rows]))
    for i in indices:
        outcomes[i].logprobs = [next(entries) for _ in outcomes[i].tokens]


def _sub_masks(masks, rows: list[int]):
    """The grammar masks of `rows` (logits rows), renumbered as their places in it."""
    if masks is None:
        return None
    where = {row: place for place, row in enumerate(rows)}
    mask_rows, bitmask = masks
    picked = [(where[row], k) for k, row in enumerate(mask_rows) if row in where]
    if not picked:
        return None
    index = torch.tensor([k for _, k in picked], dtype=torch.long)
    return [place for place, _ in picked], bitmask.index_select(0, index)


def new_speculator(config, max_model_len: int) -> Speculator | None:
    """The executor's speculator, or None with speculation off (the scheduler then plans
    no drafts either: both read the same setting)."""
    speculative = config.speculative
    return None if speculative is None else Speculator(speculative, max_model_len)
