"""The Gated DeltaNet layer's prompts through the C++ kernel (kernels/cpu/gated_delta_chunk.cpp)
against the torch chunked form, layer by layer, in one step that mixes a fresh prompt writing
two prefix-cache checkpoints, a continued prompt whose checkpoint falls on its last token, and
a one-token continuation: the same outputs, each request's slot and each checkpoint slot the
state after exactly its tokens, and every other slot untouched."""

from __future__ import annotations

import pytest
import torch

from folio.executor.models.hybrid.layers import GatedDeltaNet
from tests.executor.hybrid.prompt_in_pool_step import assert_pool_like_torch, prompt_step
from tests.executor.native_step.harness import needs_cpu_operators

pytestmark = needs_cpu_operators


@pytest.mark.parametrize("v_dtype", [torch.float32, torch.bfloat16])
def test_prompts_and_checkpoints_match_the_torch_form(v_dtype):
    step = prompt_step(heads=4, k_dim=16, v_dim=24, v_dtype=v_dtype)
    pools = {native: step.before.clone() for native in (True, False)}
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
        cpp = GatedDeltaNet._delta_rule(*step.inputs(), pools[True], step.states, native=True)
    assert "folio::gated_delta_prompt" in {event.key for event in prof.key_averages()}
    torch_out = GatedDeltaNet._delta_rule(*step.inputs(), pools[False], step.states,
                                          native=False)
    torch.testing.assert_close(cpp, torch_out, rtol=1e-5, atol=1e-5)
    assert_pool_like_torch(pools[True], pools[False], step.before)
