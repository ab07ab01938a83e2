"""The engine runs the hybrids' recurrent decode steps (and Qwen3.5's delta-rule prompts)
in C++ when the CPU library is built (and says so at start), in torch with
attention_backend='torch' (and says why), and both give the same greedy tokens on tiny
Qwen3.5 and LFM2 checkpoints in float32, in a batch where one-token prompts start fresh
states in decode-only steps beside running requests.
(tests/executor/hybrid/ checks the C++ path, the default on CPU, against transformers.)"""

from __future__ import annotations

import logging

import pytest
import torch

from folio import LLM, SamplingParams
from tests.executor.hybrid.checkpoints import make_hybrid_dir
from tests.hf_oracle import random_prompts

pytestmark = pytest.mark.usefixtures("cpu_ops_built")

# Three one-token prompts: their first step is a decode-only step with a fresh state.
PROMPTS = random_prompts(3, 5, 40, vocab=1024, seed=7)[0] + [[5], [17], [901]]
PARAMS = [SamplingParams(temperature=0.0, max_tokens=10)] * len(PROMPTS)


@pytest.mark.parametrize("family", ["qwen3_5", "lfm2"])
def test_cpp_and_torch_paths_agree_and_say_which(family, tmp_path, tokenizer_dir, caplog):
    model_dir = make_hybrid_dir(tmp_path, tokenizer_dir, family)
    answers = {}
    for backend in ("auto", "torch"):
        caplog.clear()
        with caplog.at_level(logging.INFO, logger="folio.executor"):
            llm = LLM(str(model_dir), dtype="float32", device="cpu", num_kv_blocks=64,
                      attention_backend=backend)
        started = [r.getMessage() for r in caplog.records
                   if r.getMessage().startswith("recurrent layers:")]
        with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
            answers[backend] = [r.outputs[0].token_ids for r in llm.generate(PROMPTS, PARAMS)]
        ran = {event.key for event in prof.key_averages()}
        step_op = "folio::gated_delta_step" if family == "qwen3_5" else "folio::causal_conv_step"
        prompt_ops = {"folio::gated_delta_prompt"} if family == "qwen3_5" else set()
        if backend == "auto":
            assert started and started[0].startswith(
                "recurrent layers: C++ CPU decode steps and delta-rule prompts")
            assert step_op in ran and "folio::causal_conv_step" in ran
            assert prompt_ops <= ran
        else:
            assert started == ["recurrent layers: torch decode steps and prompts, because "
                               "attention_backend='torch' chose the torch kernels"]
            assert step_op not in ran and "folio::causal_conv_step" not in ran
            assert "folio::gated_delta_prompt" not in ran
        stats = llm.stats()
        assert stats["state_slots_used"] == 0
    assert all(len(tokens) == 10 for tokens in answers["auto"])
    assert answers["auto"] == answers["torch"]
