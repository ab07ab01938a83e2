"""The engine with the Triton kernel set (interpreted on CPU here) runs a Qwen3.5's
delta-rule prompts through the Triton prompt kernel (and says so at start), and gives the
same greedy tokens as the torch kernels on a tiny float32 checkpoint, prompts of several
lengths and a one-token prompt side by side, the long ones in chunks (chunked prefill: the
later chunks start from the slot's state)."""

from __future__ import annotations

import logging

import pytest

from folio import LLM, SamplingParams
from folio.executor.models.hybrid import gated_delta
from tests.executor.hybrid.checkpoints import make_hybrid_dir
from tests.hf_oracle import random_prompts

PROMPTS = random_prompts(2, 5, 20, vocab=1024, seed=3)[0] + [[17]]
PARAMS = [SamplingParams(temperature=0.0, max_tokens=4)] * len(PROMPTS)


def test_triton_prompts_match_the_torch_kernels(tmp_path, tokenizer_dir, caplog, monkeypatch):
    model_dir = make_hybrid_dir(tmp_path, tokenizer_dir, "qwen3_5")
    launches = []   # (tokens, fresh) of each Triton prompt launch
    launch = gated_delta.prompt_in_pool_triton
    monkeypatch.setattr(gated_delta, "prompt_in_pool_triton",
                        lambda *args: launches.append((args[0].shape[0], args[-1]))
                        or launch(*args))
    answers = {}
    for backend in ("triton", "torch"):
        caplog.clear()
        with caplog.at_level(logging.INFO, logger="folio.executor"):
            llm = LLM(str(model_dir), dtype="float32", device="cpu", num_kv_blocks=64,
                      attention_backend=backend, max_num_batched_tokens=8)
        started = [r.getMessage() for r in caplog.records
                   if r.getMessage().startswith("recurrent layers:")]
        ran_before = len(launches)
        answers[backend] = [r.outputs[0].token_ids for r in llm.generate(PROMPTS, PARAMS)]
        if backend == "triton":
            assert started == ["recurrent layers: torch decode steps and Triton delta-rule "
                               "prompts"]
            # The 20-token prompt ran in chunks of at most 8 (with the running requests'
            # tokens beside them in mixed steps), the later chunks from the slot's state.
            assert launches and max(n for n, _ in launches) <= 8
            assert {fresh for _, fresh in launches} == {True, False}
        else:
            assert len(launches) == ran_before   # the torch kernels keep the torch form
        assert llm.stats()["state_slots_used"] == 0
    assert all(len(tokens) == 4 for tokens in answers["triton"])
    assert answers["triton"] == answers["torch"]
