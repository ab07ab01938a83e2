"""The Gated DeltaNet layer's prompts through the C++ kernel (kernels/cpu/gated_delta_chunk.cpp)
against the torch chunked form, layer by layer, in one step that mixes a fresh prompt writing
two prefix-cache checkpoints, a continued prompt whose checkpoint falls on its last token, and
a one-token continuation: the same outputs, each request's slot and each checkpoint slot the
state after exactly its tokens, and every other slot untouched."""

from __future__ import annotations

import pytest
import torch

from folio.executor.models.hybrid.layers import GatedDeltaNet
from folio.executor.models.hybrid.state_pool import StepStates
from tests.executor.native_step.harness import needs_cpu_operators

pytestmark = needs_cpu_operators


def _pool(num_slots: int, heads: int, k_dim: int, v_dim: int) -> torch.Tensor:
    gen = torch.Generator().manual_seed(1)
    pool = torch.randn(num_slots, heads, k_dim, v_dim, generator=gen) * 0.3
    pool[0] = float("nan")          # the fresh prompt's stale slot is never read
    return pool


@pytest.mark.parametrize("v_dtype", [torch.float32, torch.bfloat16])
def test_prompts_and_checkpoints_match_the_torch_form(v_dtype):
    heads, k_dim, v_dim = 4, 16, 24
    # Sequences: slot 0 fresh, 40 tokens, checkpoints after 16 and 32 (slots 4 and 5);
    # slot 1 continued, 16 tokens, its checkpoint after all 16 (slot 6); slot 2 continued,
    # one token. Slots 3 and 7 belong to nobody in this step.
    counts = [40, 16, 1]
    starts = [0, 40, 56, 57]
    states = StepStates(torch.tensor([0, 1, 2]), [True, False, False], starts, False,
                        [[(16, 4), (32, 5)], [(16, 6)], []], [False] * 3)
    tokens = sum(counts)
    gen = torch.Generator().manual_seed(2)
    q = torch.nn.functional.normalize(torch.randn(tokens, heads, k_dim, generator=gen), dim=-1)
    k = torch.nn.functional.normalize(torch.randn(tokens, heads, k_dim, generator=gen), dim=-1)
    v = torch.randn(tokens, heads, v_dim, generator=gen).to(v_dtype)
    g = -torch.rand(tokens, heads, generator=gen)
    beta = torch.rand(tokens, heads, generator=gen)
    before = _pool(8, heads, k_dim, v_dim)
    pools = {native: before.clone() for native in (True, False)}
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
        cpp = GatedDeltaNet._delta_rule(q, k, v, g, beta, pools[True], states, native=True)
    assert "folio::gated_delta_prompt" in {event.key for event in prof.key_averages()}
    torch_out = GatedDeltaNet._delta_rule(q, k, v, g, beta, pools[False], states, native=False)
    torch.testing.assert_close(cpp, torch_out, rtol=1e-5, atol=1e-5)
    written = [0, 1, 2, 4, 5, 6]
    torch.testing.assert_close(pools[True][written], pools[False][written], rtol=1e-5,
                               atol=1e-5)
    assert torch.equal(pools[True][[3, 7]], before[[3, 7]])
    assert not pools[True][written].isnan().any()
    # The checkpoints hold the states after 16 and 32 tokens, not the final one.
    assert not torch.allclose(pools[True][4], pools[True][5])
    assert not torch.allclose(pools[True][5], pools[True][0])
    # The continued prompt's checkpoint falls on its last token: the slot's own state.
    assert torch.equal(pools[True][6], pools[True][1])
