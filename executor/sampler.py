"""Batched next-token selection: greedy rows by argmax, the rest by temperature, top-k,
top-p and min-p, sampled with the exponential-race trick (argmax of p / Exp(1) noise).

A seeded request draws its noise from a generator seeded by (seed, output index), so its
tokens do not depend on what else is in the batch, on chunking or on preemption.
"""

from __future__ import annotations

import torch

from executor.input_batch import CachedRequest

_MIX_A = 6364136223846793005
_MIX_B = 1442695040888963407
_MASK63 = (1 << 63) - 1


def seeded_stream(seed: int, output_index: int) -> int:
    return (seed * _MIX_A + (output_index + 1) * _MIX_B) & _MASK63


class Sampler:
    def __init__(self, device: torch.device, seed: int) -> None:
        self.device = device
        self.generator = torch.Generator(device=device)
        self.generator.manual_seed(seed)
        self._seeded = torch.Generator(device=device)

    def __call__(self, logits: torch.Tensor, requests: list[CachedRequest]) -> torch.Tensor:
        greedy = [r.sampling.greedy for r in requests]
        tokens = logits.argmax(dim=-1)
        if all(greedy):
            return tokens
        rows = [i for i, g in enumerate(greedy) if not g]
        picked = [requests[i] for i in rows]
        row_index = torch.tensor(rows, device=logits.device)
        tokens[row_index] = self._sample(logits[row_index], picked)
        return tokens

    def _sample(self, logits: torch.Tensor, requests: list[CachedRequest]) -> torch.Tensor:
        params = [r.sampling for r in requests]
        device = logits.device
        temperature = torch.tensor([p.temperature for p in params], device=device)
        logits = logits / temperature[:, None]
        if any(p.top_k > 0 or p.top_p < 1.0 for p in params):
            logits = _apply_top_k_top_p(logits, [p.top_k for p in params],
                                        [p.top_p for p in params])
        probs = torch.softmax(logits, dim=-1)
        if any(p.min_p > 0 for p in params):
            min_p = torch.tensor([p.min_p for p in params], device=device)
            floor = probs.max(dim=-1, keepdim=True).values * min_p[:, None]
            probs = probs.masked_fill(probs < floor, 0.0)
        noise = torch.empty_like(probs)
        unseeded = [i for i, p in enumerate(params) if p.seed is None]
        if unseeded:
            index = torch.tensor(unseeded, device=device)
            noise[index] = torch.empty((len(unseeded), probs.shape[1]), device=device
                                       ).exponential_(generator=self.generator)
        for i, request in enumerate(requests):
            seed = request.sampling.seed
            if seed is not None:
                output_index = len(request.token_ids) - request.prompt_len
                self._seeded.manual_seed(seeded_stream(seed, output_index))
                noise[i].exponential_(generator=self._seeded)
        return (probs / noise).argmax(dim=-1)


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
