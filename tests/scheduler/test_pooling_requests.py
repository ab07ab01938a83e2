"""Pooling requests in the scheduler (SamplingParams.pooling): prompt-only requests that
share steps with generation, end when the executor returns their vector (StepResult.pooled)
with every block freed, take prefix hits (last-token) or none (mean), and a mean-pooled one
is recomputed, never swapped, when preempted."""

from __future__ import annotations

from folio.scheduler.scheduler import Scheduler
from folio.shared.config import SchedulerConfig
from folio.shared.outputs import FinishReason
from folio.shared.protocol.step import StepResult
from folio.shared.sampling_params import SamplingParams

VECTOR = b"\x00\x00\x80\x3f" * 4   # four float32 ones
LAST = SamplingParams(max_tokens=1, temperature=0.0, pooling="last", speculative=False)
MEAN = SamplingParams(max_tokens=1, temperature=0.0, pooling="mean", speculative=False)


def _scheduler(**changes) -> Scheduler:
    return Scheduler(SchedulerConfig(**{**dict(
        num_kv_blocks=32, block_size=4, max_num_seqs=8, max_num_batched_tokens=64,
        max_model_len=64, eos_token_ids=(0,), vocab_size=100), **changes}))


def _result(plan, pooled_handles: set[int]) -> StepResult:
    """The executor's answer: a vector for each pooled request whose prompt ended this step,
    a token for each generation request that reached its end."""
    result = StepResult(step_id=plan.step_id)
    ends = [(r.handle, r.num_computed_tokens + r.num_new_tokens == len(r.token_ids))
            for r in plan.new_requests]
    for handle, done in ends:
        if done and handle in pooled_handles:
            result.pooled.append((handle, VECTOR))
        elif done:
            result.handles.append(handle)
            result.token_ids.append(7)
    return result


def test_a_pooled_request_shares_a_step_with_generation_and_frees_its_blocks():
    scheduler = _scheduler()
    scheduler.add_request("gen", list(range(1, 11)), SamplingParams(max_tokens=3))
    scheduler.add_request("emb", list(range(20, 30)), LAST)
    plan = scheduler.schedule()
    assert [r.num_new_tokens for r in plan.new_requests] == [10, 10]   # one step, both
    listed = {r["id"]: r for r in scheduler.kv_map()["requests"]}   # the page map's view
    assert listed["emb"]["state"] == "running" and len(listed["emb"]["blocks"]) == 3
    pooled = {scheduler.requests["emb"].handle}
    outputs = list(scheduler.update(plan, _result(plan, pooled)))
    ended = [o for o in outputs if o.request_id == "emb"]
    assert len(ended) == 1 and ended[0].pooled == VECTOR
    assert ended[0].finish_reason == FinishReason.STOP and ended[0].new_token_ids == []
    assert "emb" not in scheduler.requests and "gen" in scheduler.requests
    stats = scheduler.stats()
    assert stats["kv_blocks_used"] == 3   # the generation request's alone
    assert stats["kv_blocks_cached"] >= 2   # the pooled prompt's full blocks stay cached
    next_plan = scheduler.schedule()
    assert next_plan.dropped_handles == list(pooled)   # the executor forgets it
    assert next_plan.running_handles == [scheduler.requests["gen"].handle]


def test_last_token_pooling_takes_prefix_hits_and_mean_pooling_none():
    scheduler = _scheduler()
    prompt = list(range(1, 14))
    for request_id, params in (("first", LAST), ("again", LAST), ("mean", MEAN)):
        scheduler.add_request(request_id, prompt, params)
        plan = scheduler.schedule()
        new = plan.new_requests[0]
        if request_id == "again":
            assert new.num_computed_tokens == 12   # three cached blocks of four
        else:
            assert new.num_computed_tokens == 0
        scheduler.update(plan, _result(plan, {new.handle}))
        assert not scheduler.requests
    assert scheduler.stats()["kv_blocks_used"] == 0


def test_a_mean_pooled_request_is_recomputed_not_swapped():
    scheduler = _scheduler(num_kv_blocks=8, max_num_batched_tokens=8, preemption_mode="swap",
                           num_swap_blocks=16)
    scheduler.add_request("mean", list(range(1, 25)), MEAN)   # six blocks, in three chunks
    plan = scheduler.schedule()
    scheduler.update(plan, _result(plan, set()))
    request = scheduler.requests["mean"]
    scheduler._preempt(request, plan)   # as when a running request needs its blocks
    assert request.status.value == "waiting" and request.num_computed_tokens == 0
    assert scheduler.stats()["preemptions_recompute"] == 1


def _run_pooled(scheduler: Scheduler) -> None:
    """Steps until every (pooled) request ended: each gets its vector in the step that
    computes its last prompt token, first chunk or later."""
    while scheduler.has_unfinished_requests():
        plan = scheduler.schedule()
        planned = set(plan.running_handles) | {r.handle for r in plan.new_requests}
        done = [r.handle for r in scheduler.requests.values()
                if r.handle in planned and r.num_computed_tokens == r.prompt_len]
        scheduler.update(plan, StepResult(step_id=plan.step_id,
                                          pooled=[(h, VECTOR) for h in done]))


def test_a_batch_of_pooled_prompts_in_chunks_leaves_each_one_cached():
    # As /v1/embeddings with a list input: the prompts queued at once, computed in chunks
    # that share steps; each one's full blocks stay findable after it ended and freed them.
    scheduler = _scheduler(max_num_batched_tokens=8)
    prompts = [list(range(1, 10)), list(range(20, 43)), [50]]
    for index, prompt in enumerate(prompts):
        scheduler.add_request(f"batch-{index}", prompt, LAST)
    _run_pooled(scheduler)
    assert scheduler.stats()["kv_blocks_used"] == 0
    for prompt in prompts:
        before = scheduler.stats()["prefix_cache_hits"]
        scheduler.add_request("again", prompt, LAST)
        _run_pooled(scheduler)
        assert scheduler.stats()["prefix_cache_hits"] - before == (len(prompt) - 1) // 4 * 4
    assert scheduler.stats()["kv_blocks_used"] == 0
