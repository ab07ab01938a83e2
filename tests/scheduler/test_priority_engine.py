"""--scheduling-policy priority on the real engine (folio.LLM, the tiny checkpoint): the
order changes, the tokens do not, and every block is free afterwards."""

from __future__ import annotations

from folio import LLM, SamplingParams
from tests.conftest import TEST_DEVICE

PROMPTS = [[(7 * i + k) % 200 + 5 for k in range(20 + 3 * i)] for i in range(6)]


def _run(llm_dir, policy: str) -> list[list[int]]:
    # One seat and a small pool: urgent arrivals preempt, preempted ones recompute.
    llm = LLM(str(llm_dir), dtype="float32", device=TEST_DEVICE, num_kv_blocks=12,
              block_size=8, max_num_seqs=2, scheduling_policy=policy)
    params = [SamplingParams(max_tokens=24, temperature=0, ignore_eos=True,
                             priority=(i % 3) if policy == "priority" else 0)
              for i in range(len(PROMPTS))]
    outputs = llm.generate(PROMPTS, params)
    stats = llm.engine.scheduler.stats()
    assert stats["kv_blocks_used"] == 0 and stats["num_waiting"] == 0
    assert stats["preemptions_recompute"] > 0   # the pool is short: the order matters
    return [list(o.outputs[0].token_ids) for o in outputs]


def test_priority_scheduling_keeps_every_requests_tokens(llama_dir):
    assert _run(llama_dir, "priority") == _run(llama_dir, "fcfs")
