"""folio.LLM(tensor_parallel_size=2) starts its own ranks (issue 30 item 1), as vLLM's
offline API does: greedy output token-identical to one rank, under preemption; close() stops
them, and a second group can start in the same process (and runs multi-step bursts)."""

from __future__ import annotations

from folio import LLM, SamplingParams
from tests.processes.test_tensor_parallel import MAX_TOKENS, PROMPTS


def _tp2(model_dir, **engine_args) -> LLM:
    return LLM(str(model_dir), dtype="float32", device="cpu", num_kv_blocks=12,
               max_num_batched_tokens=64, tensor_parallel_size=2, **engine_args)


def test_llm_tp2_matches_one_rank_and_stops_its_ranks(llama_dir, tp_references):
    reference = tp_references.one_rank(llama_dir)
    params = [SamplingParams(temperature=0.0, max_tokens=n) for n in MAX_TOKENS]
    llm = _tp2(llama_dir)
    rank1 = llm.engine.ranks.children[1]
    try:
        assert [r.outputs[0].token_ids for r in llm.generate(PROMPTS, params)] == reference
        assert llm.stats()["preemptions_recompute"] > 0
    finally:
        llm.close()
    assert rank1.poll() is not None   # stopped, not left behind
    # The first group's torch.distributed state is gone; every rank runs the same
    # multi-step bursts (each samples the same tokens, so each stops a row alike).
    again = _tp2(llama_dir, num_scheduler_steps=4)
    try:
        assert [r.outputs[0].token_ids for r in again.generate(PROMPTS, params)] == reference
        assert again.stats()["multi_step_extra_tokens"] > 0
    finally:
        again.close()
