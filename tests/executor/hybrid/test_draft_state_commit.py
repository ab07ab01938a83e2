"""The recurrent layers' draft window, layer by layer: a sequence verifying drafts keeps the
state after each of its tokens, and committing the state after the tokens kept leaves its
slot exactly where decoding only those tokens one step at a time leaves it (the convolution
window and, for Gated DeltaNet, the delta rule's matrices), with the same outputs."""

from __future__ import annotations

import pytest
import torch

from folio import LLM
from tests.executor.hybrid.checkpoints import make_hybrid_dir


@pytest.fixture(scope="module", params=["qwen3_5", "lfm2"])
def executor(request, tmp_path_factory, tokenizer_dir):
    path = make_hybrid_dir(tmp_path_factory.mktemp(request.param), tokenizer_dir,
                           request.param)
    return LLM(str(path), dtype="float32", device="cpu", num_kv_blocks=16,
               max_num_seqs=4).engine.executor


@pytest.mark.parametrize("kept", [1, 2, 4])   # all drafts rejected, some, none
def test_commit_leaves_the_state_of_the_tokens_kept(executor, kept):
    pool = executor.states
    mixer = executor.model.layers[0].mixer   # a recurrent layer in both checkpoints
    torch.manual_seed(kept)
    for tensors in (pool.conv, pool.delta):   # slots 0 and 1 start from the same state
        for tensor in tensors.values():
            tensor[0] = torch.randn_like(tensor[0])
            tensor[1] = tensor[0]
    x = torch.randn(4, executor.model_config.hidden_size)
    with torch.inference_mode():
        # Slot 0: the verified token and three drafts in one step, then the commit.
        states = pool.step([0], [7], [0, 4], drafted=[True])
        drafted = mixer(x, pool, states)
        assert all(torch.equal(t[0], t[1]) for d in (pool.conv, pool.delta)
                   for t in d.values()), "the slot was written before verification"
        pool.commit(states, [kept])
        # Slot 1: only the tokens kept, one decode step each.
        decoded = [mixer(x[t:t + 1], pool, pool.step([1], [7 + t], [0, 1]))
                   for t in range(kept)]
    torch.testing.assert_close(drafted[:kept], torch.cat(decoded), rtol=0, atol=0)
    for tensors in (pool.conv, pool.delta):
        for tensor in tensors.values():
            torch.testing.assert_close(tensor[0], tensor[1], rtol=0, atol=0)
