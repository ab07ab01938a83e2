"""The engine with the Triton kernel set (interpreted on CPU here) runs a Qwen3.5's
delta-rule prompts through the Triton prompt kernel (and says so at start), and gives the
same greedy tokens as the torch kernels on a tiny float32 checkpoint, prompts of several
lengths and a one-token prompt side by side."""

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
    lengths = []
    launch = gated_delta.prompt_in_pool_triton
    monkeypatch.setattr(gated_delta, "prompt_in_pool_triton",
                        lambda *args: lengths.append(args[0].shape[0]) or launch(*args))
    answers = {}
    for backend in ("triton", "torch"):
        caplog.clear()
        with caplog.at_level(logging.INFO, logger="folio.executor"):
            llm = LLM(str(model_dir), dtype="float32", device="cpu", num_kv_blocks=64,
                      attention_backend=backend)
        started = [r.getMessage() for r in caplog.records
                   if r.getMessage().startswith("recurrent layers:")]
        ran_before = len(lengths)
        answers[backend] = [r.outputs[0].token_ids for r in llm.generate(PROMPTS, PARAMS)]
        if backend == "triton":
            assert started == ["recurrent layers: torch decode steps and Triton delta-rule "
                               "prompts"]
            assert sorted(set(lengths)) == sorted({len(p) for p in PROMPTS[:2]} | {1})
        else:
            assert len(lengths) == ran_before   # the torch kernels keep the torch form
        assert llm.stats()["state_slots_used"] == 0
    assert all(len(tokens) == 4 for tokens in answers["triton"])
    assert answers["triton"] == answers["torch"]
