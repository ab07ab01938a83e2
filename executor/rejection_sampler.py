"""Rejection sampling of n-gram drafts (Leviathan et al., arXiv 2211.17192) with a one-hot
proposal: the draft d at a row whose distribution is p is accepted with probability p(d);
otherwise the token is drawn from p with d removed, renormalised, and the step's tokens end
there. Whichever happens, the token at that row has distribution p: the output is
distributed as without speculation.

A seeded request draws its uniforms from a stream of its own per (seed, output index), so
its tokens repeat run to run whatever the batch; the stream differs from the ordinary
draw's (a salt), so the accept test and the residual draw are independent of the draw a
row makes when every draft before it was accepted.
"""

from __future__ import annotations

import torch

from folio.executor.sampler import Sampler, _inverse_cdf, seeded_stream

_SALT = 0x2545F4914F6CDD1D


def verify_sampled(probs: torch.Tensor, proposed: list[int], request, sampler: Sampler
                   ) -> tuple[int, int | None]:
    """(drafts accepted, the token drawn at the first rejected row), or (all, None) when
    every draft is accepted (the caller draws the last row's token as usual). `probs`:
    one row per draft plus the last, each the request's processed distribution."""
    count = len(proposed)
    uniforms = _uniforms(request, count, sampler, probs.device)
    p = probs[:count].float()
    index = torch.arange(count, device=probs.device)
    draft_mass = p[index, torch.tensor(proposed, dtype=torch.long, device=probs.device)]
    total = p.sum(dim=-1)
    accept = (uniforms[:, 0] * total < draft_mass).tolist()
    residual_mass = (total - draft_mass).tolist()
    for row in range(count):
        # No mass besides the draft (a rounding edge): the draft is the only choice.
        if accept[row] or residual_mass[row] <= 0:
            continue
        residual = p[row].clone()
        residual[proposed[row]] = 0.0
        token = _inverse_cdf(residual[None], uniforms[row:row + 1, 1:2])
        return row, int(token[0])
    return count, None


def _uniforms(request, count: int, sampler: Sampler, device: torch.device) -> torch.Tensor:
    """(count, 2) uniforms: the accept test's and the residual draw's, per draft row."""
    seed = request.sampling.seed
    if seed is None:
        return torch.rand((count, 2), generator=sampler.generator, device=device)
    output_index = len(request.token_ids) - request.prompt_len
    generator = torch.Generator(device=device)
    rows = []
    for row in range(count):
        generator.manual_seed(seeded_stream(seed ^ _SALT, output_index + row))
        rows.append(torch.rand(2, generator=generator, device=device))
    return torch.stack(rows)
