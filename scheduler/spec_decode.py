"""The scheduler's half of speculative decoding (docs/spec_decode.md): how many draft
tokens a running request's step may carry, the KV slots they need, what a result's
accepted drafts change, the policy that turns drafts off, and the counters.

The scheduler counts verified tokens only: a decode step with drafts adds one to
num_computed_tokens, like any decode step; the drafts a step may write are kept apart
(Request.draft_steps, by step id, and their sum num_draft_slots) so the slots asked for
cover every position the executor may write whatever the steps in flight accept. When a
result says `a` drafts were accepted, their KV was written by that step from those very
tokens: the request's computed count grows by `a`, unless it was preempted since (then it
recomputes them).
"""

from __future__ import annotations

from folio.scheduler.request import Request
from folio.shared.spec_decode_config import SpeculativeConfig
from folio.shared.protocol.step import StepPlan, StepResult

COUNTERS = ("spec_decode_num_drafts", "spec_decode_num_draft_tokens",
            "spec_decode_num_accepted_tokens")


def room(request: Request) -> int:
    """Extra tokens a decode step may add after its own without any step in flight writing
    past the request's length limit (max_tokens or the context)."""
    return request.stop_num_tokens - 2 - request.num_computed_tokens - request.num_draft_slots


class DraftPlanner:
    def __init__(self, config: SpeculativeConfig) -> None:
        self.config = config
        self.counters = dict.fromkeys(COUNTERS, 0)
        # Accepted drafts by their position in the step (0: the first draft).
        self.accepted_per_position = [0] * config.num_speculative_tokens

    def step_allows(self, num_running: int) -> bool:
        """Whether this step may carry drafts at all: not in a large (compute-bound) batch."""
        return num_running <= self.config.max_running

    def cap(self, request: Request, step: int, budget: int) -> int:
        """Drafts the request's decode step may carry, before its verified token is
        counted: within k, the step's token budget left after that token, and the
        request's length limit (every position the steps in flight may write stays
        below it, so nothing past max_tokens or the context is ever written)."""
        sampling = request.sampling
        if (not sampling.speculative or sampling.prompt_logprobs is not None
                or step < request.spec_paused_until):
            return 0
        return max(0, min(self.config.num_speculative_tokens, budget - 1, room(request)))

    def tokens_in_pass(self, cap: int) -> int:
        """What a cap adds to the step's one forward pass: drafts are verified in it."""
        return cap

    def planned(self, request: Request, step: int, drafts: int) -> None:
        request.draft_steps[step] = drafts
        request.num_draft_slots += drafts

    def preempted(self, request: Request) -> None:
        """Its KV is gone or leaves the device: drafts in flight no longer count."""
        request.draft_steps.clear()
        request.num_draft_slots = 0

    def apply(self, plan: StepPlan, result: StepResult, by_handle: dict[int, Request]) -> None:
        """Before the result's tokens are appended: each request of the plan that could
        carry drafts takes its accepted ones as computed, and keeps one pending step per
        step (its tokens are appended one by one, each counting one pending off)."""
        outcome = {handle: (proposed, accepted) for handle, proposed, accepted in result.drafts}
        for handle in plan.drafts:
            request = by_handle.get(handle)
            if request is None:
                continue   # finished while its step was in flight
            planned = request.draft_steps.pop(plan.step_id, None)
            if planned is not None:
                request.num_draft_slots -= planned
            proposed, accepted = outcome.get(handle, (0, 0))
            if not proposed:
                continue
            accepted = min(accepted, proposed)
            request.num_pending += accepted
            if planned is not None:   # not preempted since: the step's KV is its own
                request.num_computed_tokens += accepted
            self._count(request, plan.step_id, proposed, accepted)

    def _count(self, request: Request, step: int, proposed: int, accepted: int) -> None:
        """The counters and the pause policy, per request step that carried drafts."""
        counters, per_position = self.counters, self.accepted_per_position
        counters["spec_decode_num_drafts"] += 1
        counters["spec_decode_num_draft_tokens"] += proposed
        counters["spec_decode_num_accepted_tokens"] += accepted
        for position in range(min(accepted, len(per_position))):
            per_position[position] += 1
        request.spec_steps += 1
        request.spec_accepted_total += accepted
        self._judge(request, step, proposed, accepted)

    def _judge(self, request: Request, step: int, proposed: int, accepted: int) -> None:
        """Pause a request whose recent drafts are mostly rejected."""
        config = self.config
        request.spec_proposed += proposed
        request.spec_accepted += accepted
        if request.spec_proposed < config.acceptance_window:
            return
        if request.spec_accepted < config.min_acceptance * request.spec_proposed:
            request.spec_paused_until = step + 1 + config.cooldown_steps
        request.spec_proposed = request.spec_accepted = 0

    def summary(self) -> dict[str, float]:
        """The page map's figures: drafts, draft tokens, accepted tokens and the mean
        accepted length (1 + accepted / drafts; 1.0 before any draft)."""
        counters = self.counters
        drafts = counters["spec_decode_num_drafts"]
        accepted = counters["spec_decode_num_accepted_tokens"]
        return {"drafts": drafts, "draft_tokens": counters["spec_decode_num_draft_tokens"],
                "accepted_tokens": accepted,
                "mean_accepted_length": 1 + accepted / drafts if drafts else 1.0}

    def stats(self) -> dict[str, int | list[int]]:
        return {**self.counters,
                "spec_decode_num_accepted_tokens_per_pos": list(self.accepted_per_position)}


class SpecLog:
    """The periodic log line of speculative decoding: every `interval_s` while drafts are
    verified, the share of draft tokens accepted and the mean accepted length (tokens a
    request gets per step that carries drafts: 1 + accepted / drafts, vLLM's measure)."""

    def __init__(self, interval_s: float = 10.0) -> None:
        self.interval_s = interval_s
        self.last_at = 0.0
        self.last = (0, 0, 0)

    def line(self, now: float, stats: dict) -> str | None:
        if now - self.last_at < self.interval_s or "spec_decode_num_drafts" not in stats:
            return None
        counts = (stats["spec_decode_num_drafts"], stats["spec_decode_num_draft_tokens"],
                  stats["spec_decode_num_accepted_tokens"])
        drafts, tokens, accepted = (a - b for a, b in zip(counts, self.last))
        self.last_at = now
        if not drafts:
            return None
        self.last = counts
        return (f"speculative decoding: {drafts} drafts of {tokens} tokens, "
                f"{100 * accepted / max(tokens, 1):.1f}% accepted, mean accepted length "
                f"{1 + accepted / drafts:.2f}")
