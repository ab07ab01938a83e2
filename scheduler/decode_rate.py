"""How fast decode steps read the model's weights: the executor's forward time of each step
that only decodes (one new token per running request, no prompt, no draft), against the
weights' bytes a step reads (ExecutorCapacity.weight_bytes_per_step).

The last WINDOW such steps make `decode_weight_read_gbps`, the effective bandwidth a user
compares with the machine's copy bandwidth (bench/bandwidth.py): one user's step at the
memory's speed reads its bytes in bytes / bandwidth seconds.
"""

from __future__ import annotations

from collections import deque

from folio.shared.protocol.step import StepPlan, StepResult

WINDOW = 64


class DecodeRate:
    def __init__(self, weight_bytes_per_step: int) -> None:
        self.weight_bytes_per_step = weight_bytes_per_step
        self.steps = 0
        self.forward_seconds = 0.0
        self.recent: deque[float] = deque(maxlen=WINDOW)

    def observe(self, plan: StepPlan, result: StepResult, bursts: bool = False) -> None:
        """`bursts`: the plan's caps are multi-step bursts (scheduler/multi_step.py), whose
        passes each read the weights once; drafts verified in one pass are not decode-only."""
        decode_only = (not plan.new_requests and (bursts or not plan.drafts)
                       and plan.running_num_tokens
                       and all(n == 1 for n in plan.running_num_tokens))
        if not decode_only or result.forward_ms <= 0:
            return
        passes = 1 + max((accepted for _, _, accepted in result.drafts), default=0)
        self.steps += passes
        self.forward_seconds += result.forward_ms / 1e3
        self.recent.extend([result.forward_ms / 1e3 / passes] * passes)

    def stats(self) -> dict[str, int | float]:
        recent = sum(self.recent)
        gbps = (self.weight_bytes_per_step * len(self.recent) / recent / 1e9) if recent else 0.0
        return {"decode_steps": self.steps, "decode_forward_seconds": self.forward_seconds,
                "weight_bytes_per_step": self.weight_bytes_per_step,
                "decode_weight_read_gbps": gbps}
