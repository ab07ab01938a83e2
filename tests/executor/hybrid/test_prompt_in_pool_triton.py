"""The Gated DeltaNet layer's prompts through the Triton kernel (kernels/triton_gated_delta.py
`delta_rule_prompt`, the Triton kernel set's path; under the interpreter here) against the
torch chunked form, in one step that mixes a fresh prompt writing two prefix-cache
checkpoints, a continued prompt whose checkpoint falls on its last token, and a one-token
continuation: the same outputs, each request's slot and each checkpoint slot the state after
exactly its tokens, and every other slot untouched. And a hybrid model built with the Triton
kernel set runs its delta-rule layers that way."""

from __future__ import annotations

import pytest
import torch

from folio.executor.models.hybrid import gated_delta
from folio.executor.models.hybrid.layers import GatedDeltaNet
from folio.executor.models.hybrid.state_pool import StepStates


def _pool(num_slots: int, heads: int, k_dim: int, v_dim: int) -> torch.Tensor:
    gen = torch.Generator().manual_seed(1)
    pool = torch.randn(num_slots, heads, k_dim, v_dim, generator=gen) * 0.3
    pool[0] = float("nan")          # the fresh prompt's stale slot is never read
    return pool


@pytest.mark.parametrize("v_dtype", [torch.float32, torch.bfloat16])
def test_prompts_and_checkpoints_match_the_torch_form(v_dtype, monkeypatch):
    heads, k_dim, v_dim = 2, 16, 40   # two column blocks, the second masked
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
    pools = {path: before.clone() for path in ("triton", "torch")}
    calls = []
    launch = gated_delta.prompt_in_pool_triton
    monkeypatch.setattr(gated_delta, "prompt_in_pool_triton",
                        lambda *args: calls.append(args[0].shape[0]) or launch(*args))
    triton_out = GatedDeltaNet._delta_rule(q, k, v, g, beta, pools["triton"], states,
                                           triton=True)
    assert calls == [16, 16, 8, 16, 1]   # one launch per segment between checkpoints
    torch_out = GatedDeltaNet._delta_rule(q, k, v, g, beta, pools["torch"], states)
    torch.testing.assert_close(triton_out, torch_out, rtol=1e-5, atol=1e-5)
    written = [0, 1, 2, 4, 5, 6]
    torch.testing.assert_close(pools["triton"][written], pools["torch"][written], rtol=1e-5,
                               atol=1e-5)
    assert torch.equal(pools["triton"][[3, 7]], before[[3, 7]])
    assert not pools["triton"][written].isnan().any()
    # The checkpoints hold the states after 16 and 32 tokens, not the final one.
    assert not torch.allclose(pools["triton"][4], pools["triton"][5])
    assert not torch.allclose(pools["triton"][5], pools["triton"][0])
    # The continued prompt's checkpoint falls on its last token: the slot's own state.
    assert torch.equal(pools["triton"][6], pools["triton"][1])
