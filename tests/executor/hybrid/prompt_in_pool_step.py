"""The step the prompt-in-pool tests run through each kernel set (test_prompt_in_pool.py: C++,
test_prompt_in_pool_triton.py: Triton): a fresh prompt writing two prefix-cache checkpoints,
a continued prompt whose checkpoint falls on its last token and a one-token continuation,
and the checks on the state pool it leaves."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from folio.executor.models.hybrid.state_pool import StepStates

# Slots the step writes: the three requests' own (0-2) and the checkpoints (4-6); 3 and 7
# belong to nobody.
WRITTEN = [0, 1, 2, 4, 5, 6]
UNTOUCHED = [3, 7]


@dataclass
class PromptStep:
    q: torch.Tensor
    k: torch.Tensor
    v: torch.Tensor
    g: torch.Tensor
    beta: torch.Tensor
    before: torch.Tensor      # the pool before the step (slot 0 NaN: never read)
    states: StepStates

    def inputs(self) -> tuple[torch.Tensor, ...]:
        return self.q, self.k, self.v, self.g, self.beta


def prompt_step(heads: int, k_dim: int, v_dim: int, v_dtype: torch.dtype) -> PromptStep:
    """Sequences: slot 0 fresh, 40 tokens, checkpoints after 16 and 32 (slots 4 and 5);
    slot 1 continued, 16 tokens, its checkpoint after all 16 (slot 6); slot 2 continued,
    one token."""
    states = StepStates(torch.tensor([0, 1, 2]), [True, False, False], [0, 40, 56, 57], False,
                        [[(16, 4), (32, 5)], [(16, 6)], []], [False] * 3)
    tokens = 57
    gen = torch.Generator().manual_seed(2)
    q = torch.nn.functional.normalize(torch.randn(tokens, heads, k_dim, generator=gen), dim=-1)
    k = torch.nn.functional.normalize(torch.randn(tokens, heads, k_dim, generator=gen), dim=-1)
    v = torch.randn(tokens, heads, v_dim, generator=gen).to(v_dtype)
    g = -torch.rand(tokens, heads, generator=gen)
    beta = torch.rand(tokens, heads, generator=gen)
    pool = torch.randn(8, heads, k_dim, v_dim, generator=torch.Generator().manual_seed(1)) * 0.3
    pool[0] = float("nan")          # the fresh prompt's stale slot is never read
    return PromptStep(q, k, v, g, beta, pool, states)


def assert_pool_like_torch(pool: torch.Tensor, torch_pool: torch.Tensor,
                           before: torch.Tensor) -> None:
    """`pool` after the step through a kernel against `torch_pool` after the torch form."""
    torch.testing.assert_close(pool[WRITTEN], torch_pool[WRITTEN], rtol=1e-5, atol=1e-5)
    assert torch.equal(pool[UNTOUCHED], before[UNTOUCHED])
    assert not pool[WRITTEN].isnan().any()
    # The checkpoints hold the states after 16 and 32 tokens, not the final one.
    assert not torch.allclose(pool[4], pool[5])
    assert not torch.allclose(pool[5], pool[0])
    # The continued prompt's checkpoint falls on its last token: the slot's own state.
    assert torch.equal(pool[6], pool[1])
