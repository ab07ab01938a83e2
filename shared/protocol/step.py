"""The scheduler -> executor step plan and the executor -> scheduler step result.

Requests are named by small integer handles that the scheduler assigns, so that a decode
step for a running request costs a few bytes. A request's token ids and sampling parameters
cross once, in `NewRequest`; afterwards a plan carries only how many tokens to compute and
which blocks were appended. The executor keeps the tokens it sampled and feeds them back.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from folio.shared.sampling_params import SamplingParams


@dataclass(slots=True)
class NewRequest:
    handle: int
    token_ids: list[int]          # prompt plus any output kept across a recompute preemption
    prompt_len: int               # token_ids[prompt_len:] are earlier outputs
    num_computed_tokens: int      # tokens whose KV is already in the cache (prefix hits)
    num_new_tokens: int           # tokens to compute in this step
    block_ids: list[int]
    sampling: SamplingParams
    cache_scope: str | None = None   # the client that sent it: whose cached outputs it reads
    state_slot: int = -1          # a hybrid model's recurrent state slot (-1: none)


@dataclass(slots=True)
class StepPlan:
    step_id: int
    new_requests: list[NewRequest] = field(default_factory=list)
    # Requests the executor already holds: compute this many more tokens each.
    running_handles: list[int] = field(default_factory=list)
    running_num_tokens: list[int] = field(default_factory=list)
    # Blocks appended to a running request's table, by handle (only those that grew).
    new_block_ids: dict[int, list[int]] = field(default_factory=dict)
    # Requests the executor must forget before this step (finished, aborted, preempted).
    dropped_handles: list[int] = field(default_factory=list)
    # Block moves, applied before the forward pass: (source, destination) pairs.
    swap_out: list[tuple[int, int]] = field(default_factory=list)
    swap_in: list[tuple[int, int]] = field(default_factory=list)
    copies: list[tuple[int, int]] = field(default_factory=list)
    # Speculative decoding (docs/spec_decode.md): running requests (by handle) whose step
    # may carry up to this many draft tokens after its verified one; the executor proposes
    # them from its own tokens. Not counted in running_num_tokens.
    drafts: dict[int, int] = field(default_factory=dict)
    # A hybrid model's state slots (docs/hybrid.md): copies (checkpoint slot, request slot)
    # applied before the forward pass, and checkpoints to write during it: (handle, tokens,
    # slot), the request's state after its first `tokens` tokens, copied into `slot`.
    state_copies: list[tuple[int, int]] = field(default_factory=list)
    checkpoints: list[tuple[int, int, int]] = field(default_factory=list)
    # A hybrid's state slots swapped with their request's blocks, in the blocks' order:
    # out (device slot, CPU slot) after the block swap-out, in (CPU slot, device slot)
    # after the block swap-in, both before state_copies.
    state_swap_out: list[tuple[int, int]] = field(default_factory=list)
    state_swap_in: list[tuple[int, int]] = field(default_factory=list)

    @property
    def num_scheduled_tokens(self) -> int:
        return sum(r.num_new_tokens for r in self.new_requests) + sum(self.running_num_tokens)

    @property
    def is_empty(self) -> bool:
        return not (self.new_requests or self.running_handles)


@dataclass(slots=True)
class StepResult:
    step_id: int
    # The sampled tokens of each request that reached the end of its known tokens: one,
    # or with drafts verified (see `drafts`) several, consecutive, in order.
    handles: list[int] = field(default_factory=list)
    token_ids: list[int] = field(default_factory=list)
    # Aligned with handles when any request asked for logprobs, else empty: None, or
    # (sampled token's logprob, its rank, top-k ids, top-k logprobs).
    logprobs: list[tuple[float, int, list[int], list[float]] | None] = field(
        default_factory=list)
    # Prompt logprobs computed this step: (handle, first prompt position, entries).
    prompt_logprobs: list[tuple[int, int, list[tuple[float, int, list[int], list[float]]]]] = \
        field(default_factory=list)
    forward_ms: float = 0.0
    # Requests that failed alone this step (a non-finite row, a grammar past its budget):
    # (handle, why). Not in `handles`; the scheduler ends each with an error.
    failed: list[tuple[int, str]] = field(default_factory=list)
    # Each request that carried drafts: (handle, drafts proposed, drafts accepted); its
    # entries in `handles` are the accepted drafts and the token after them.
    drafts: list[tuple[int, int, int]] = field(default_factory=list)
    # Pooling requests (shared/pooling/) whose prompt ended this step: (handle, the pooled
    # vector as float32 bytes). Not in `handles`: nothing was sampled, the request ends.
    pooled: list[tuple[int, bytes]] = field(default_factory=list)
