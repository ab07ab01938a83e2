"""Rejection sampling of n-gram drafts (Leviathan et al., arXiv 2211.17192) with a one-hot
proposal: the draft d at a row whose distribution is p is accepted with probability p(d);
otherwise the token is drawn from p with d removed, renormalised, and the request's tokens
for the step end there. Whichever happens, the token at that row has distribution p: the
output is distributed as without speculation.

Seeded requests do not come here: their drafts are checked against their rows' own seeded
draws (executor/spec_decode/speculator.py verify), so their text does not depend on whether
drafts were made.

One pass for the whole batch: the accept tests of every draft row at once, then the
residual draws of the rows that rejected.
"""

from __future__ import annotations

import torch

from folio.executor.sampler import Sampler, inverse_cdf


def verify_sampled(probs: torch.Tensor, spans: list[tuple[int, list[int]]], requests: list,
                   sampler: Sampler) -> list[tuple[int, int | None]]:
    """For each request, its first row in `probs` and its drafts (one row per draft, then
    the last row): (drafts accepted, the token drawn at the first rejected row), or (all,
    None) when every draft is accepted (the caller draws the last row's token as usual)."""
    device = probs.device
    draft_rows = [first + j for first, drafts in spans for j in range(len(drafts))]
    draft_ids = [token for _, drafts in spans for token in drafts]
    rows = torch.tensor(draft_rows, dtype=torch.long, device=device)
    p = probs.index_select(0, rows).float()
    ids = torch.tensor(draft_ids, dtype=torch.long, device=device)
    draft_mass = p.gather(1, ids[:, None])[:, 0]
    total = p.sum(dim=-1)
    uniforms = torch.rand((len(draft_rows), 2), generator=sampler.generator, device=device)
    # No mass besides the draft (a rounding edge): the draft is the only choice.
    accept = ((uniforms[:, 0] * total < draft_mass) | (total - draft_mass <= 0)).tolist()
    answers: list[tuple[int, int | None]] = []
    rejected: list[int] = []   # index into draft rows of each request's first rejection
    offset = 0
    for _, drafts in spans:
        count = len(drafts)
        accepted = next((j for j in range(count) if not accept[offset + j]), count)
        if accepted < count:
            rejected.append(offset + accepted)
        answers.append((accepted, None))
        offset += count
    if rejected:
        index = torch.tensor(rejected, dtype=torch.long, device=device)
        residual = p.index_select(0, index)
        residual.scatter_(1, ids.index_select(0, index)[:, None], 0.0)
        tokens = inverse_cdf(residual, uniforms.index_select(0, index)[:, 1:2]).tolist()
        drawn = iter(tokens)
        answers = [(accepted, next(drawn)) if accepted < len(drafts) else (accepted, None)
                   for (accepted, _), (_, drafts) in zip(answers, spans)]
    return answers

