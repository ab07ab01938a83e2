"""Batched next-token selection over the whole batch, as tensor operations.

Order, as vLLM applies it: a structured-output grammar's token mask (its rows only), logit
bias, the min_tokens ban on stop tokens, repetition / frequency / presence penalties, then
greedy argmax, or temperature, top-k, top-p, min-p and a draw by inverse CDF (one uniform
per row against the cumulative probabilities). Rows without a setting
pay nothing for it. Log-probabilities are taken from the raw logits.

A row whose logits are not finite where it is drawn (NaN or +inf from the model, or every
token banned) fails that request alone: `sample` names it in `failed` with the reason and
gives it a harmless placeholder token, so the step, and every other row, goes on. The
check costs nothing extra: greedy rows look at the maximum they take anyway, sampled rows
at the total mass of the inverse CDF.

A seeded request draws its uniform from a generator seeded by (seed, output index), so its
tokens do not depend on what else is in the batch, on chunking or on preemption.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from folio.executor.structured_output import apply_masks
from folio.executor.input_batch import CachedRequest

_MIX_A = 6364136223846793005
_MIX_B = 1442695040888963407
_MASK63 = (1 << 63) - 1


def seeded_stream(seed: int, output_index: int) -> int:
    return (seed * _MIX_A + (output_index + 1) * _MIX_B) & _MASK63


@dataclass
class TokenLogprobs:
    """Log-probabilities around one sampled token: its own and the top k."""

    logprob: float
    rank: int                       # 1 = the most likely token
    top_ids: list[int]
    top_logprobs: list[float]


@dataclass
class SampledBatch:
    tokens: list[int]
    logprobs: list[TokenLogprobs | None]
    failed: dict[int, str] = field(default_factory=dict)   # row -> why its request failed


NOT_FINITE = ("sampling failed: the logits became NaN or infinite (the model's output, or "
              "what the sampling parameters made of it), so no token can be drawn")
NO_TOKEN = ("sampling failed: no token is allowed (the structured-output grammar, min_tokens "
            "and logit_bias together ban every one)")


class Sampler:
    def __init__(self, device: torch.device, seed: int, eos_token_ids: tuple[int, ...]) -> None:
        self.device = device
        self.eos_token_ids = eos_token_ids
        self.generator = torch.Generator(device=device)
        self.generator.manual_seed(seed)
        self._seeded = torch.Generator(device=device)

    def sample(self, logits: torch.Tensor, requests: list[CachedRequest],
               masks: tuple[list[int], torch.Tensor] | None = None) -> SampledBatch:
        """`masks`: (rows, int32 bitmask) of the rows a grammar constrains
        (executor/structured_output.py); applied first, to those rows only."""
        raw = logits
        logits = self.processed(logits, requests, masks)
        best, tokens = logits.max(dim=-1)   # max, not argmax: a NaN row shows in `best`
        bad = ~torch.isfinite(best)
        rows = [i for i, r in enumerate(requests) if not r.sampling.greedy]
        if rows:
            row_index = torch.tensor(rows, device=logits.device)
            drawn, drawn_bad = self._draw(logits[row_index], [requests[i] for i in rows])
            tokens[row_index] = drawn
            bad[row_index] = drawn_bad
        failed: dict[int, str] = {}
        if bool(bad.any()):
            for i in torch.nonzero(bad).flatten().tolist():
                failed[i] = NO_TOKEN if float(best[i]) == float("-inf") else NOT_FINITE
            tokens[bad] = self.eos_token_ids[0] if self.eos_token_ids else 0
        logprobs = self._logprobs(raw, tokens, requests)
        for i in failed:
            logprobs[i] = None
        return SampledBatch(tokens.tolist(), logprobs, failed)

    # ---- logit processing ---------------------------------------------------------------

    def processed(self, logits: torch.Tensor, requests: list[CachedRequest],
                  masks: tuple[list[int], torch.Tensor] | None = None) -> torch.Tensor:
        """The logits every choice is made from: grammar masks, logit bias, the
        min_tokens ban and penalties applied (the raw logits are not changed)."""
        if masks is not None:
            logits = apply_masks(logits.clone(), *masks)
        return self._process(logits, requests, cloned=masks is not None)

    def probabilities(self, logits: torch.Tensor, requests: list[CachedRequest]
                      ) -> torch.Tensor:
        """Each sampled row's distribution over processed logits: temperature, top-k,
        top-p, then min-p."""
        params = [r.sampling for r in requests]
        device = logits.device
        temperature = torch.tensor([max(float(p.temperature), 1e-5) for p in params],
                                   device=device)
        logits = logits / temperature[:, None]
        if any(p.top_k > 0 or p.top_p < 1.0 for p in params):
            logits = _apply_top_k_top_p(logits, [p.top_k for p in params],
                                        [p.top_p for p in params])
        probs = torch.softmax(logits, dim=-1)
        if any(p.min_p > 0 for p in params):
            min_p = torch.tensor([p.min_p for p in params], device=device)
            floor = probs.max(dim=-1, keepdim=True).values * min_p[:, None]
            probs = probs.masked_fill(probs < floor, 0.0)
        return probs

    def _process(self, logits: torch.Tensor, requests: list[CachedRequest],
                 cloned: bool = False) -> torch.Tensor:
        biased = [(i, r.sampling.logit_bias) for i, r in enumerate(requests)
                  if r.sampling.logit_bias]
        banned = [(i, r) for i, r in enumerate(requests)
                  if len(r.token_ids) - r.prompt_len < r.sampling.min_tokens]
        penalized = [i for i, r in enumerate(requests) if r.sampling.needs_penalties()]
        if not (biased or banned or penalized):
            return logits
        if not cloned:
            logits = logits.clone()
        if biased:
            rows = [i for i, bias in biased for _ in bias]
            cols = [t for _, bias in biased for t in bias]
            values = [v for _, bias in biased for v in bias.values()]
            logits.index_put_((self._long(rows), self._long(cols)),
                              torch.tensor(values, device=logits.device), accumulate=True)
        if banned:
            rows, cols = [], []
            for i, request in banned:
                stops = set(request.sampling.stop_token_ids)
                if not request.sampling.ignore_eos:
                    stops.update(self.eos_token_ids)
                rows += [i] * len(stops)
                cols += sorted(stops)
            if rows:
                logits[self._long(rows), self._long(cols)] = float("-inf")
        if penalized:
            index = self._long(penalized)
            logits[index] = _apply_penalties(logits[index], [requests[i] for i in penalized])
        return logits

    def _draw(self, logits: torch.Tensor, requests: list[CachedRequest]
              ) -> tuple[torch.Tensor, torch.Tensor]:
        """The drawn tokens, and which rows had no finite probability mass to draw from."""
        probs = self.probabilities(logits, requests)
        cdf = probs.float().cumsum(dim=-1)
        total = cdf[:, -1]
        bad = ~(torch.isfinite(total) & (total > 0))
        return inverse_cdf(probs, self._uniforms(requests, logits.device), cdf), bad

    def _uniforms(self, requests: list[CachedRequest], device: torch.device) -> torch.Tensor:
        """One U[0, 1) per row: the batch generator's, or for a seeded request one from
        its own (seed, output index) stream, so its draw does not depend on the batch."""
        uniforms = torch.empty((len(requests), 1), device=device).uniform_(
            generator=self.generator)
        for i, request in enumerate(requests):
            seed = request.sampling.seed
            if seed is not None:
                output_index = len(request.token_ids) - request.prompt_len
                self._seeded.manual_seed(seeded_stream(seed, output_index))
                uniforms[i] = torch.empty(1, device=device).uniform_(generator=self._seeded)
        return uniforms

    def _logprobs(self, raw: torch.Tensor, tokens: torch.Tensor,
                  requests: list[CachedRequest]) -> list[TokenLogprobs | None]:
        rows = [i for i, r in enumerate(requests) if r.sampling.logprobs is not None]
        result: list[TokenLogprobs | None] = [None] * len(requests)
        if not rows:
            return result
        index = self._long(rows)
        logprobs = torch.log_softmax(raw[index], dim=-1)
        chosen = logprobs.gather(1, tokens[index][:, None])
        ranks = (logprobs > chosen).sum(dim=-1) + 1
        k = max(requests[i].sampling.logprobs for i in rows)
        top = logprobs.topk(k, dim=-1) if k else None
        for j, i in enumerate(rows):
            want = requests[i].sampling.logprobs
            result[i] = TokenLogprobs(
                logprob=float(chosen[j, 0]), rank=int(ranks[j]),
                top_ids=top.indices[j, :want].tolist() if want else [],
                top_logprobs=top.values[j, :want].tolist() if want else [])
        return result

    def logprobs_of(self, raw: torch.Tensor, tokens: list[int],
                    requests: list[CachedRequest]) -> list[TokenLogprobs | None]:
        """The logprobs entries (for the rows that ask) of given tokens under raw logits."""
        return self._logprobs(raw, self._long(tokens), requests)

    def _long(self, values: list[int]) -> torch.Tensor:
        return torch.tensor(values, dtype=torch.long, device=self.device)


def score_tokens(logits: torch.Tensor, targets: list[int], k: int
                 ) -> list[tuple[float, int, list[int], list[float]]]:
    """Log-probability and rank of each target token under its row of raw logits, with the
    top k: the prompt-logprobs entries."""
    logprobs = torch.log_softmax(logits, dim=-1)
    index = torch.tensor(targets, dtype=torch.long, device=logits.device)[:, None]
    chosen = logprobs.gather(1, index)
    ranks = ((logprobs > chosen).sum(dim=-1) + 1).tolist()
    values = chosen[:, 0].tolist()
    if k:
        top = logprobs.topk(k, dim=-1)
        top_ids, top_values = top.indices.tolist(), top.values.tolist()
    else:
        top_ids = top_values = [[] for _ in targets]
    return [(values[i], ranks[i], top_ids[i], top_values[i]) for i in range(len(targets))]


def _apply_penalties(logits: torch.Tensor, requests: list[CachedRequest]) -> torch.Tensor:
    """Repetition penalty over prompt and output tokens (as transformers applies it);
    frequency and presence penalties over output tokens (as OpenAI and vLLM define them)."""
    rows, vocab = logits.shape
    device = logits.device
    seen = torch.zeros((rows, vocab), dtype=torch.bool, device=device)
    counts = torch.zeros((rows, vocab), dtype=logits.dtype, device=device)
    for j, request in enumerate(requests):
        ids = torch.tensor(request.token_ids, dtype=torch.long, device=device)
        seen[j, ids] = True
        output = ids[request.prompt_len:]
        if len(output):
            counts[j].index_add_(0, output, torch.ones_like(output, dtype=logits.dtype))
    params = [r.sampling for r in requests]
    repetition = torch.tensor([p.repetition_penalty for p in params], device=device)[:, None]
    penalized = torch.where(logits > 0, logits / repetition, logits * repetition)
    logits = torch.where(seen, penalized, logits)
    frequency = torch.tensor([p.frequency_penalty for p in params], device=device)[:, None]
    presence = torch.tensor([p.presence_penalty for p in params], device=device)[:, None]
    return logits - frequency * counts - presence * (counts > 0).to(logits.dtype)


def inverse_cdf(probs: torch.Tensor, uniforms: torch.Tensor,
                 cdf: torch.Tensor | None = None) -> torch.Tensor:
    """Token i with probability probs[i]: the first whose cumulative mass passes u * total.
    One pass over the vocabulary and one random number per row; drawing Exp(1) noise for
    every token (the exponential race) cost 30x more on CPU. Zero-mass tokens are never
    chosen: the target stays strictly below the total. A row without finite mass (NaN)
    would find no such token and return the vocabulary size: clamped to a real id (the
    caller fails that row), never an index past the embedding (on CUDA a device assert)."""
    if cdf is None:
        cdf = probs.float().cumsum(dim=-1)
    total = cdf[:, -1:]
    target = torch.minimum(uniforms * total, torch.nextafter(total, torch.zeros_like(total)))
    return torch.searchsorted(cdf, target, right=True)[:, 0].clamp_(max=cdf.shape[-1] - 1)


def _apply_top_k_top_p(logits: torch.Tensor, top_k: list[int], top_p: list[float]
                       ) -> torch.Tensor:
    vocab = logits.shape[-1]
    device = logits.device
    sorted_logits, order = logits.sort(dim=-1, descending=True)
    k = torch.tensor([vocab if k <= 0 else min(k, vocab) for k in top_k], device=device)
    rank = torch.arange(vocab, device=device)[None, :]
    drop = rank >= k[:, None]
    probs = torch.softmax(sorted_logits.masked_fill(drop, float("-inf")), dim=-1)
    before = probs.cumsum(dim=-1) - probs      # mass of strictly better tokens
    p = torch.tensor(top_p, device=device)
    drop |= before >= p[:, None]
    drop[:, 0] = False                         # always keep the best token
    sorted_logits = sorted_logits.masked_fill(drop, float("-inf"))
    return torch.empty_like(logits).scatter_(-1, order, sorted_logits)
