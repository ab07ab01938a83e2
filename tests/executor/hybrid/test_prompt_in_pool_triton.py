"""The Gated DeltaNet layer's prompts through the Triton kernel (kernels/triton_gated_delta.py
`delta_rule_prompt`, the Triton kernel set's path; under the interpreter here) against the
torch chunked form, in one step that mixes a fresh prompt writing two prefix-cache
checkpoints, a continued prompt whose checkpoint falls on its last token, and a one-token
continuation: the same outputs, each request's slot and each checkpoint slot the state after
exactly its tokens, and every other slot untouched (test_hybrid_triton_prompts.py runs a
whole hybrid model with the Triton kernel set)."""

from __future__ import annotations

import pytest
import torch

from folio.executor.models.hybrid import gated_delta
from folio.executor.models.hybrid.layers import GatedDeltaNet
from tests.executor.hybrid.prompt_in_pool_step import assert_pool_like_torch, prompt_step


@pytest.mark.parametrize("v_dtype", [torch.float32, torch.bfloat16])
def test_prompts_and_checkpoints_match_the_torch_form(v_dtype, monkeypatch):
    # Two column blocks, the second masked.
    step = prompt_step(heads=2, k_dim=16, v_dim=40, v_dtype=v_dtype)
    pools = {path: step.before.clone() for path in ("triton", "torch")}
    calls = []
    launch = gated_delta.prompt_in_pool_triton
    monkeypatch.setattr(gated_delta, "prompt_in_pool_triton",
                        lambda *args: calls.append(args[0].shape[0]) or launch(*args))
    triton_out = GatedDeltaNet._delta_rule(*step.inputs(), pools["triton"], step.states,
                                           triton=True)
    assert calls == [16, 16, 8, 16, 1]   # one launch per segment between checkpoints
    torch_out = GatedDeltaNet._delta_rule(*step.inputs(), pools["torch"], step.states)
    torch.testing.assert_close(triton_out, torch_out, rtol=1e-5, atol=1e-5)
    assert_pool_like_torch(pools["triton"], pools["torch"], step.before)
