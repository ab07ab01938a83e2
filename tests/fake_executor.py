"""An executor without a model: checks each plan against what it was told before and
answers with deterministic tokens, so scheduler logic is tested at full speed."""

from __future__ import annotations

from shared.step import StepPlan, StepResult


class FakeExecutor:
    def __init__(self, block_size: int, vocab_size: int = 1000) -> None:
        self.block_size = block_size
        self.vocab_size = vocab_size
        self.requests: dict[int, dict] = {}

    def execute(self, plan: StepPlan) -> StepResult:
        for handle in plan.finished_handles:
            assert handle in self.requests, f"forget of unknown handle {handle}"
            del self.requests[handle]
        scheduled = []
        for new in plan.new_requests:
            assert new.handle not in self.requests, "new request already held"
            state = {"tokens": list(new.token_ids), "computed": new.num_computed_tokens,
                     "blocks": list(new.block_ids)}
            self.requests[new.handle] = state
            scheduled.append((new.handle, state, new.num_new_tokens))
        for handle, count in zip(plan.running_handles, plan.running_num_tokens):
            state = self.requests[handle]
            state["blocks"].extend(plan.new_block_ids.get(handle, []))
            scheduled.append((handle, state, count))
        result = StepResult(plan.step_id)
        for handle, state, count in scheduled:
            assert count >= 1
            state["computed"] += count
            assert state["computed"] <= len(state["tokens"]), "computing unknown tokens"
            assert len(state["blocks"]) * self.block_size >= state["computed"], "no slot"
            if state["computed"] == len(state["tokens"]):
                token = (handle * 7919 + len(state["tokens"]) * 104729) % self.vocab_size
                state["tokens"].append(token)
                result.handles.append(handle)
                result.token_ids.append(token)
        return result
